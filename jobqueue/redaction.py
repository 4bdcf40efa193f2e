"""One redaction for agent text: the secrets of a job's dispatch_context that an agent echoed
into what it reports (`message`, `result`, `external_id`, its log) are replaced by
`[redacted]` wherever that text is shown or sent: the admin's job page (fields, attempts
table, event details, log tails), the admin's webhook deliveries and the webhook payloads.

A secret is every string of 4 characters or more anywhere in the dispatch_context (values,
not keys). Whole occurrences are replaced, and so is the piece of one that a cut splits (from
3 characters on): the end of a text (a line still being written, a message cut to a size) and,
for a text that may start inside the agent's output (a log tail, a message that keeps the
output's last characters), its start.
"""

from __future__ import annotations

REDACTED = "[redacted]"
MIN_SECRET_CHARS = 4
MIN_PIECE_CHARS = 3


def secret_strings(value, found=None) -> list[str]:
    """The strings (of MIN_SECRET_CHARS or more) in a dispatch_context, longest first."""
    found = [] if found is None else found
    if isinstance(value, str) and len(value) >= MIN_SECRET_CHARS:
        found.append(value)
    elif isinstance(value, dict):
        for item in value.values():
            secret_strings(item, found)
    elif isinstance(value, list):
        for item in value:
            secret_strings(item, found)
    return sorted(set(found), key=len, reverse=True)


def redact_text(text: str, secrets: list[str], *, cut: bool = True) -> str:
    """`text` without the secrets: every whole one, and the part of one that the text's end
    or (`cut`: the text may start inside the agent's output) its start splits."""
    if not secrets or not text:
        return text
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    for secret in secrets:
        pieces = range(len(secret) - 1, MIN_PIECE_CHARS - 1, -1)  # the longest first
        head = next((k for k in pieces if cut and text.startswith(secret[-k:])), 0)
        tail = next((k for k in pieces if text.endswith(secret[:k])), 0)
        text = (REDACTED if head else "") + text[head:len(text) - tail] + \
            (REDACTED if tail else "")
    return text


def redact_value(value, secrets: list[str]):
    """A JSON value (a result, an event's detail) with every string in it redacted (keys
    too): whole occurrences only, since a JSON string is never cut."""
    if not secrets:
        return value
    if isinstance(value, str):
        for secret in secrets:
            value = value.replace(secret, REDACTED)
        return value
    if isinstance(value, dict):
        return {redact_value(k, secrets): redact_value(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_value(item, secrets) for item in value]
    return value


def redact_job_document(doc: dict, secrets: list[str]) -> dict:
    """A job as a webhook sends it, its agent text redacted (message may be cut)."""
    if not secrets:
        return doc
    out = dict(doc)
    for name in ("message", "external_id"):
        if isinstance(out.get(name), str):
            out[name] = redact_text(out[name], secrets)
    if "result" in out:
        out["result"] = redact_value(out["result"], secrets)
    return out
