"""The API's only parser: JSON, refusing what the database could not store.

PostgreSQL refuses NUL characters in text and jsonb, and non-finite numbers in jsonb; both
are turned away here as 400 validation errors instead of reaching the database. Nesting too
deep to parse is a 400 as well. No message quotes the body or the charset it came in.
"""

from __future__ import annotations

import codecs
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
                             parse_constant=_refuse_constant)
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
