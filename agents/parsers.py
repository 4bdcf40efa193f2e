"""The API's only parser: JSON, refusing what the database could not store, and reading
numbers as both databases give them back.

PostgreSQL refuses NUL characters in text and jsonb, and non-finite numbers in jsonb; both
are turned away here as 400 validation errors instead of reaching the database. Nesting too
deep to parse is a 400 as well. No message quotes the body or the charset it came in.

Numbers: jsonb keeps a number as a decimal (PostgreSQL's `numeric`), which has no negative
zero and writes a number as digits, without an exponent: stored on PostgreSQL, `-0.0` came
back as `0.0` and `1.5e308` as a 309-digit integer, while SQLite (which keeps JSON text) gave
them back as sent. So they are read here as jsonb gives them back, whatever the database:
`-0.0` as `0.0`, and a number with a fraction or an exponent whose magnitude is 1e16 or more
(every such float is a whole number) as the integer its decimal form names (`1.5e308` as 15
and 307 zeros; `1e16` as 10000000000000000). Every other number is kept as it is: jsonb
gives back the same float (`1e-07` as `0.0000001`, which reads as the same float).
"""

from __future__ import annotations

import codecs
import decimal
import json
import math

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser, get_encoding

MAX_DEPTH = 64


class StrictJSONParser(JSONParser):
    """JSON, refusing what the database could not store; its errors never quote the body
    (DRF's would: the decoder's message, an undecodable byte, the charset sent)."""

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            encoding = get_encoding(parser_context or {})
        except ParseError:
            raise ParseError(
                "Unsupported charset in the Content-Type header: send JSON as UTF-8."
            ) from None
        try:
            data = json.load(codecs.getreader(encoding)(stream),
                             parse_constant=_refuse_constant, parse_float=read_float,
                             parse_int=_read_int)
        except json.JSONDecodeError as exc:
            # exc.msg is the decoder's fixed text, but may end in a quoted character.
            what = exc.msg.split(": ", 1)[0]
            raise ParseError(
                f"JSON parse error - {what} at line {exc.lineno}, column {exc.colno}."
            ) from None
        except UnicodeError:
            raise ParseError(
                "JSON parse error - the body is not valid text in its charset (UTF-8 unless "
                "the Content-Type names another)."
            ) from None
        except BadNumber as exc:
            raise ParseError(f"JSON parse error - {exc}.") from None
        except ValueError:  # NaN, Infinity
            raise ParseError("JSON parse error - numbers must be finite.") from None
        except RecursionError:
            raise ParseError("JSON parse error - nested too deeply.") from None
        problem = find_unstorable(data)
        if problem:
            raise ParseError(f"JSON parse error - {problem}.")
        return data


def _refuse_constant(name):
    raise ValueError(name)


class BadNumber(ValueError):
    """A JSON number that cannot be stored; its message says why (never the number)."""


FLOAT_AS_INTEGER_FROM = 1e16  # where repr() of a float starts to use an exponent
MAX_INTEGER_DIGITS = 4300  # Python's limit on reading an integer from text


def read_float(text: str) -> float | int:
    """A JSON number with a fraction or an exponent, as PostgreSQL's jsonb gives it back (the
    module's docstring): -0.0 as 0.0; from 1e16 on, the integer its shortest decimal form
    names."""
    value = float(text)
    if not math.isfinite(value):
        raise BadNumber("numbers must be finite")
    if value == 0:
        return 0.0
    if abs(value) >= FLOAT_AS_INTEGER_FROM:
        return int(decimal.Decimal(repr(value)))
    return value


def _read_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INTEGER_DIGITS:
        raise BadNumber(f"integers must have at most {MAX_INTEGER_DIGITS} digits")
    return int(text)


def find_unstorable(value, depth: int = 0) -> str | None:
    """Why `value` cannot be stored as-is, or None."""
    if depth > MAX_DEPTH:
        return f"nested deeper than {MAX_DEPTH} levels"
    if isinstance(value, str):
        if "\x00" in value:
            return "strings must not contain NUL (\\u0000)"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "strings must be valid Unicode (no lone surrogates)"
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else "numbers must be finite"
    if isinstance(value, dict):
        for key, item in value.items():
            problem = find_unstorable(key, depth + 1) or find_unstorable(item, depth + 1)
            if problem:
                return problem
    elif isinstance(value, list):
        for item in value:
            problem = find_unstorable(item, depth + 1)
            if problem:
                return problem
    return None
