"""Numbers in query strings (`?page_size=`, `?wait_seconds=`, `?offset=`, `?attempt=`): one
parser for all of them.

A number is ASCII digits and nothing else: no sign, no spaces, no `_`, no other script's digits.
(Python's `str.isdigit()` takes `²` and `①`, which `int()` refuses, and `int()` takes `٥`,
` 5` and `1_0`.) Anything else, or a value out of bounds, is a 400 naming the parameter and its
bounds, never the value sent.
"""

from __future__ import annotations

import re

from rest_framework.exceptions import ValidationError

DIGITS = re.compile(r"[0-9]{1,18}")


def query_int(request, name: str, low: int, high: int) -> int | None:
    """`?<name>=` as an int from `low` to `high`; None when absent."""
    raw = request.query_params.get(name)
    if raw is None:
        return None
    value = int(raw) if DIGITS.fullmatch(raw) else None
    if value is None or not low <= value <= high:
        raise ValidationError({name: [f"Must be an integer from {low} to {high}."]})
    return value
