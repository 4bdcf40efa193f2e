"""Reading the API's answers in tests: its timestamps and its error bodies."""

import datetime as dt


def parse_ts(value: str) -> dt.datetime:
    """An answer's timestamp (ISO 8601, `Z` for UTC) as an aware datetime."""
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


def api_error(r, status, code, field=None) -> dict:
    """Assert that `r` is the API's error answer `status` / `code` (with `field` among its
    fields, if named), and return its body."""
    assert r.status_code == status, (r.status_code, r.content)
    body = r.json()
    assert body["code"] == code and body["detail"] and set(body) <= {"code", "detail", "fields"}
    if field:
        assert field in body["fields"]
    return body
