"""The API's only parser: JSON, refusing what the database could not store.

PostgreSQL refuses NUL characters in text and jsonb, and non-finite numbers in jsonb; both
are turned away here as 400 validation errors instead of reaching the database. Nesting too
deep to parse is a 400 as well.
"""

from __future__ import annotations

import math

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

MAX_DEPTH = 64


class StrictJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError as exc:
            raise ParseError("JSON parse error - nested too deeply.") from exc
        problem = find_unstorable(data)
        if problem:
            raise ParseError(f"JSON parse error - {problem}.")
        return data


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
