"""The client's errors: every error answer of the server becomes an `ApiError` subclass
carrying the response's stable `code` (`error_from_response`, by `error_class` of its status
and code), so callers branch on types (or `code`), never on text. Network failures (no answer
at all) become `TransportError`. Shared by both clients (client.py, producer.py); client.py
re-exports every name here, so `from jobqueue_client.client import LeaseLost` still works.
"""

from __future__ import annotations

import httpx

# Codes that mean "this claim is no longer yours": stop the job, publish nothing.
LEASE_LOST_CODES = frozenset({"claim_superseded", "lease_expired", "job_cancelled", "job_finished",
                              "deadline_exceeded"})


class ApiError(Exception):
    """An error answer from the server (or, for TransportError, no answer at all)."""

    #: True when the same request may succeed later (network, 5xx, 429).
    transient = False
    #: The address tried when no answer came (TransportError), for the logs.
    url: str | None = None

    def __init__(self, status: int, code: str, detail: str = "", *, fields=None,
                 retry_after: float | None = None, length: int | None = None):
        self.status = status
        self.code = code
        self.detail = detail
        self.fields = fields or {}
        self.retry_after = retry_after
        self.length = length  # a log's length (the Range header of a log append's refusal)
        super().__init__(f"{status} {code}: {detail}" if status else f"{code}: {detail}")


class TransportError(ApiError):
    """No response: connection refused or reset, timeout, DNS, protocol error. `url` is the
    address that was tried (no credential is ever part of it), for the logs."""

    transient = True

    def __init__(self, detail: str, url: str | None = None):
        super().__init__(0, "network_error", detail)
        self.url = url

    @classmethod
    def of(cls, exc: httpx.TransportError) -> TransportError:
        try:
            url = str(exc.request.url)
        except RuntimeError:  # httpx: an error raised before a request was attached
            url = None
        return cls(f"{type(exc).__name__}: {exc}", url)


class ServerError(ApiError):
    """5xx: the server failed; the request may be retried."""

    transient = True


class Throttled(ApiError):
    """429: slow down; `retry_after` holds the server's hint in seconds."""

    transient = True


class AuthError(ApiError):
    """401/403: the token is wrong, revoked, or not allowed here. Not retried."""


class NotFound(ApiError):
    """404: no such job or agent, or not yours."""


class Unsupported(ApiError):
    """404/405 from an optional endpoint (batch claim, batch heartbeat) the server lacks."""


class LeaseLost(ApiError):
    """409 claim_superseded / lease_expired / job_cancelled / job_finished /
    deadline_exceeded: the claim is no longer this agent's to act on."""


class DeadlineExceeded(LeaseLost):
    """409 deadline_exceeded: a clock (the job's max_runtime_seconds or expires_at) ended
    the attempt. A LeaseLost: stop the work and publish nothing."""


class NotClaimable(ApiError):
    """409 job_not_claimable, or agent_paused (an operator paused the agent's claims)."""


class Conflict(ApiError):
    """Any other 409 (e.g. invalid_transition)."""


class EffectAlreadyCommitted(Conflict):
    """409 effect_already_committed: the effect's outcome is recorded, with another result
    (nothing changed). Begin it again to read the recorded one."""


class EffectNotBegun(Conflict):
    """409 effect_not_begun: a commit for a key this attempt has not begun (begin it first,
    and handle `unknown`)."""


class InvalidRequest(ApiError):
    """400, 413, 415, 416, 422: the request itself is wrong; retrying it cannot help."""


class LogGap(InvalidRequest):
    """416 log_range_gap: the chunk started past the log's end; `length` is the log's."""


def error_from_response(response: httpx.Response) -> ApiError:
    status = response.status_code
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        body = {}
    code = str(body.get("code") or _default_code(status))
    detail = str(body.get("detail") or response.reason_phrase or "")
    fields = body.get("fields") if isinstance(body.get("fields"), dict) else None
    retry_after = _retry_after(response.headers.get("Retry-After"))
    length = _range_length(response.headers.get("Range"))
    cls = error_class(status, code)
    return cls(status, code, detail, fields=fields, retry_after=retry_after, length=length)


_CONFLICTS = {"deadline_exceeded": DeadlineExceeded, "job_not_claimable": NotClaimable,
              "agent_paused": NotClaimable, "effect_already_committed": EffectAlreadyCommitted,
              "effect_not_begun": EffectNotBegun}


def error_class(status: int, code: str) -> type[ApiError]:
    """The ApiError subclass for an error answer's status and code."""
    if status >= 500:
        cls = ServerError
    elif status == 429:
        cls = Throttled
    elif status in (401, 403):
        cls = AuthError
    elif status == 404:
        cls = NotFound
    elif status == 409:
        cls = _CONFLICTS.get(code) or (LeaseLost if code in LEASE_LOST_CODES else Conflict)
    elif status == 408:
        cls = ServerError
    else:
        cls = InvalidRequest
    return cls


def _range_length(value: str | None) -> int | None:
    """`0-<length>` (a log's length, on 416 and 413 answers to a log append)."""
    if not value or not value.startswith("0-") or not value[2:].isdigit():
        return None
    return int(value[2:])


def _default_code(status: int) -> str:
    return {
        400: "validation_error", 401: "not_authenticated", 403: "permission_denied",
        404: "not_found", 405: "method_not_allowed", 409: "conflict",
        413: "payload_too_large", 415: "unsupported_media_type", 429: "throttled",
    }.get(status, "server_error" if status >= 500 else f"http_{status}")


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None
