"""A small synchronous HTTP client for the agent side of the v1 API (httpx).

Importable without Django: it imports nothing from `django` or `jobqueue`. Every error the
server answers becomes an `ApiError` subclass carrying the response's stable `code`, so callers
branch on types (or `code`), never on text. Network failures become `TransportError`.

One client may be shared by several threads (httpx.Client pools its connections).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx

from . import version

# Codes that mean "this claim is no longer yours": stop the job, publish nothing.
LEASE_LOST_CODES = frozenset({"claim_superseded", "lease_expired", "job_cancelled", "job_finished",
                              "deadline_exceeded"})


# --- errors ------------------------------------------------------------------------------


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


# --- results -----------------------------------------------------------------------------


def parse_time(value: str) -> dt.datetime:
    """ISO 8601 from the server (`Z` or an offset); naive values are taken as UTC."""
    parsed = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


@dataclass(frozen=True)
class Claim:
    """One granted claim: the job (with its dispatch_context) and its lease."""

    job: dict
    claim_id: str
    attempt: int
    lease_seconds: int
    heartbeat_interval_seconds: float
    claim_expires_at: dt.datetime
    server_time: dt.datetime
    # What an earlier attempt saved for this one to resume from (None: nothing).
    checkpoint: Any = field(default=None, repr=False)
    # The claim's signed fencing token (a compact JWS), for outside resources to verify
    # offline (fencing.verify_fencing_token; None from a server that sends none).
    fencing_token: str | None = field(default=None, repr=False)

    @property
    def job_id(self) -> str:
        return str(self.job["id"])

    @property
    def lease_remaining(self) -> float:
        """Seconds of lease left when the server answered, by the server's own clock."""
        return (self.claim_expires_at - self.server_time).total_seconds()

    @classmethod
    def from_payload(cls, payload: dict) -> Claim:
        job, claim = payload["job"], payload["claim"]
        return cls(
            job=job,
            claim_id=str(claim["claim_id"]),
            attempt=int(claim.get("attempt", job.get("attempt", 0))),
            lease_seconds=int(claim["lease_seconds"]),
            heartbeat_interval_seconds=float(
                claim.get("heartbeat_interval_seconds") or max(1, int(claim["lease_seconds"]) // 3)
            ),
            claim_expires_at=parse_time(claim["claim_expires_at"]),
            server_time=parse_time(claim.get("server_time") or claim["claim_expires_at"]),
            checkpoint=claim.get("checkpoint"),
            fencing_token=claim.get("fencing_token"),
        )

    def __repr__(self) -> str:  # never print dispatch_context
        return f"Claim(job_id={self.job_id!r}, attempt={self.attempt})"


@dataclass(frozen=True)
class Renewal:
    """A heartbeat's answer for one job: renewed with a new expiry, or refused with a code."""

    job_id: str
    renewed: bool
    claim_expires_at: dt.datetime | None = None
    server_time: dt.datetime | None = None
    code: str = ""

    @property
    def lease_remaining(self) -> float:
        if self.claim_expires_at is None or self.server_time is None:
            return 0.0
        return (self.claim_expires_at - self.server_time).total_seconds()


EFFECT_KEY = re.compile(r"[A-Za-z0-9._:-]{1,200}")


def check_effect_key(key: str) -> str:
    """An effect key as the server takes it (1 to 200 of A-Z a-z 0-9 . _ : -), checked here
    too because it is part of the request's path: `.` or `..` would name another path
    (URLs drop dot segments), so a key of dots only is refused without asking."""
    if not isinstance(key, str) or not EFFECT_KEY.fullmatch(key) or not key.strip("."):
        raise InvalidRequest(400, "validation_error",
                             "key must be 1 to 200 characters of A-Z a-z 0-9 . _ : - "
                             "(not dots only)", fields={"key": ["invalid"]})
    return key


class Effect:
    """One step of a job done outside the service, as the effect ledger answered it
    (docs/effects.md): what `AgentClient.begin_effect` and `effect()` hand the caller.

    `state` is "started" (no attempt began it: do it now), "unknown" (an earlier attempt
    began it and recorded no outcome: reconcile with the outside system) or "committed"
    (done: `result` is the recorded outcome; do not do it again). `effect_id` is the same
    for every attempt of the job: give it to the outside system as its idempotency key.
    `attempt`: started, this attempt; unknown, the earlier one; committed, the committer.
    `commit(result)` records the outcome (once; the same result again is accepted)."""

    STARTED, UNKNOWN, COMMITTED = "started", "unknown", "committed"

    def __init__(self, key: str, answer: dict, commit=None):
        self.key = key
        self._commit = commit
        self._update(answer)

    def _update(self, answer: dict) -> None:
        try:  # the documented shape, or the client's protocol error (as claim bodies are)
            state, effect_id, attempt = answer["state"], answer["effect_id"], answer["attempt"]
            if (state not in (self.STARTED, self.UNKNOWN, self.COMMITTED)
                    or not isinstance(effect_id, str) or not effect_id
                    or type(attempt) is not int or attempt < 1
                    or (state == self.COMMITTED and "result" not in answer)):
                raise ValueError(answer)
        except (KeyError, TypeError, ValueError):
            raise ServerError(200, "invalid_response", "Unexpected effect answer.") from None
        self.state, self.effect_id, self.attempt = state, effect_id, attempt
        self.result = answer.get("result")

    @property
    def committed(self) -> bool:
        return self.state == self.COMMITTED

    def commit(self, result: Any = None) -> Any:
        """Record `result` (any JSON) as the effect's outcome and return it. Raises
        LeaseLost when the claim is no longer current (nothing recorded), and
        EffectAlreadyCommitted when another result is recorded already."""
        if self._commit is None:
            raise RuntimeError("this Effect is not bound to a claim")
        self._update(self._commit(result))
        return self.result

    def __repr__(self) -> str:  # the result may be private: not printed
        return (f"Effect(key={self.key!r}, state={self.state!r}, effect_id={self.effect_id!r}, "
                f"attempt={self.attempt})")


# --- the client --------------------------------------------------------------------------

# A claim-next whose answer is lost (a transport error, a 5xx) is sent again this many times
# in all, with the same Idempotency-Key: the server answers the claim(s) the first one made.
CLAIM_SENDS = 3
HOLDER_MAX = 200
# An effect's begin or commit whose answer is lost (a transport error, 5xx, 429) is sent
# again this many times in all: both are safe to repeat (the same attempt's begin answers
# the same; the same result again is accepted unchanged).
EFFECT_SENDS = 3


def default_holder() -> str:
    """This process, as claims name it for operators: host and pid."""
    host = "".join(ch for ch in socket.gethostname() if ch.isprintable())[:180]
    return f"{host}:{os.getpid()}"


class ApiClient:
    """What both clients share (AgentClient here, ProducerClient in producer.py): one
    httpx.Client under /v1/workspaces/{workspace_id}/ sending the credential's headers, a
    connection of its own for held requests (long-poll) that abort_wait() closes from another
    thread, and every error answer turned into an ApiError by `error_from_response`."""

    #: Turns an error answer (status >= 400) into the exception to raise.
    error_from_response = staticmethod(error_from_response)

    def __init__(self, server: str, workspace_id: str, credential_headers: dict[str, str], *,
                 timeout: float = 10.0, transport: httpx.BaseTransport | None = None,
                 user_agent: str | None = None):
        self.server = server.rstrip("/")
        self.workspace_id = str(workspace_id)
        self.timeout = timeout
        self._http = httpx.Client(
            base_url=f"{self.server}/v1/workspaces/{self.workspace_id}/",
            headers={**credential_headers, "Accept": "application/json",
                     "User-Agent": version.user_agent(user_agent)},
            timeout=timeout,
            transport=transport,
        )
        # Held requests (wait_seconds) go on a connection of their own, which abort_wait()
        # closes from another thread: a stopping process does not sit out a 50 s wait.
        self._client_args = {"base_url": self._http.base_url, "headers": self._http.headers,
                             "transport": transport}
        self._wait_http: httpx.Client | None = None
        self._wait_lock = threading.Lock()
        self._aborted = False

    def close(self) -> None:
        self.abort_wait()
        self._http.close()

    def abort_wait(self) -> None:
        """End a held request now (from any thread): it raises TransportError, and no
        request waits again on this client."""
        with self._wait_lock:
            self._aborted = True
            held, self._wait_http = self._wait_http, None
        if held is not None:
            held.close()

    def _waiting_client(self) -> httpx.Client:
        with self._wait_lock:
            if self._aborted:
                raise TransportError("The wait was aborted.")
            if self._wait_http is None:
                self._wait_http = httpx.Client(timeout=self.timeout, **self._client_args)
            return self._wait_http

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- plumbing --

    def _request(self, method: str, path: str, *, json: Any = None, params=None,
                 timeout: float | None = None, content=None, headers=None,
                 wait: float = 0, stream: bool = False) -> httpx.Response:
        """Send one request; an error answer raises (the class's error_from_response), a
        lost one raises TransportError. With `stream`, the body of a successful answer is
        left unread: the caller iterates it and closes the response."""
        kwargs: dict[str, Any] = {"params": params}
        if headers:
            kwargs["headers"] = headers
        if json is not None:
            kwargs["json"] = json
        if content is not None:
            kwargs["content"] = content
        if timeout is not None:
            kwargs["timeout"] = timeout
        http = self._http
        if wait:
            http = self._waiting_client()
            kwargs["timeout"] = self.timeout + wait
        try:
            response = http.send(http.build_request(method, path, **kwargs), stream=stream)
        except RuntimeError as exc:
            if not wait:
                raise
            # httpx: the client was closed under the request (abort_wait)
            raise TransportError(  # pragma: no cover -- abort_wait() just before send(): a race
                f"The wait was aborted: {exc}") from None
        except httpx.TransportError as exc:
            raise TransportError.of(exc) from None
        if response.status_code >= 400:
            if stream:
                try:
                    response.read()
                except httpx.TransportError as exc:
                    raise TransportError.of(exc) from None
                finally:
                    response.close()
            raise self.error_from_response(response)
        return response

    @staticmethod
    def _json(response: httpx.Response) -> Any:
        try:
            return response.json()
        except ValueError as exc:
            raise ServerError(response.status_code, "invalid_response",
                              "The server answered with something that is not JSON.") from exc


class AgentClient(ApiClient):
    """The agent's view of the API: claim, heartbeat, report, release (single and batch)."""

    def __init__(self, server: str, workspace_id: str, agent_id: str, token: str, *,
                 timeout: float = 10.0, transport: httpx.BaseTransport | None = None,
                 user_agent: str | None = "jobqueue-agent", holder: str | None = None,
                 claim_sends: int = CLAIM_SENDS):
        super().__init__(server, workspace_id, {"Authorization": f"Bearer {token}"},
                         timeout=timeout, transport=transport, user_agent=user_agent)
        # Sent with every claim ("" sends none); operators see it in the admin, nobody else.
        self.holder = (default_holder() if holder is None else holder)[:HOLDER_MAX]
        self.claim_sends = max(1, int(claim_sends))
        self.agent_id = str(agent_id)

    def __repr__(self) -> str:  # never print the token
        return f"AgentClient(server={self.server!r}, agent={self.agent_id!r})"

    def _agent_path(self, suffix: str) -> str:
        return f"job-agents/{self.agent_id}/{suffix}"

    # -- agent endpoints --

    def list_jobs(self, status: str = "queued", *, cursor: str | None = None,
                  page_size: int | None = None) -> dict:
        """One page of this agent's jobs (lightweight items, never dispatch_context)."""
        params = {"status": status}
        if cursor:
            params["cursor"] = cursor
        if page_size:
            params["page_size"] = page_size
        return self._json(self._request("GET", self._agent_path("jobs"), params=params))

    def _with_holder(self, body: dict) -> dict:
        return {**body, "holder": self.holder} if self.holder else body

    def _claim_next_request(self, body: dict, *, wait: float = 0) -> httpx.Response:
        """POST jobs/claim with one Idempotency-Key for every send: a send whose answer was
        lost (transport error, 5xx) is repeated with the same key, and the server answers
        the claim(s) the first one made instead of handing out more jobs."""
        headers = {"Idempotency-Key": f"claim-{uuid.uuid4().hex}"}
        for send in range(1, self.claim_sends + 1):
            try:
                return self._request("POST", self._agent_path("jobs/claim"),
                                     json=self._with_holder(body), headers=headers, wait=wait)
            except (TransportError, ServerError):
                if send == self.claim_sends:
                    raise
                time.sleep(0.05 * send)
        raise AssertionError("unreachable")  # pragma: no cover -- the loop returns or raises

    def claim(self, job_id: str, *, expected_attempt: int | None = None) -> Claim:
        """Claim the named job (only while its attempt is still `expected_attempt`, if
        given). Raises NotClaimable when someone else has it or it is not due."""
        body = self._with_holder({})
        if expected_attempt is not None:
            body["expected_attempt"] = int(expected_attempt)
        response = self._request("POST", self._agent_path(f"jobs/{job_id}/claim"),
                                 json=body or None)
        return Claim.from_payload(self._json(response))

    def claim_next(self, *, wait_seconds: int = 0) -> Claim | None:
        """Claim the next due job (single path); None when nothing is claimable (204).
        With wait_seconds, the server holds the request until a job comes (long-poll)."""
        body = {"wait_seconds": int(wait_seconds)} if wait_seconds else {}
        response = self._claim_next_request(body, wait=wait_seconds)
        if response.status_code == 204 or not response.content:
            return None
        return Claim.from_payload(self._json(response))

    def claim_batch(self, limit: int, *, wait_seconds: int = 0) -> list[Claim]:
        """Claim up to `limit` due jobs in one request (held up to wait_seconds when none
        is claimable). Raises Unsupported (404/405) when the server has no batch claim, so
        the caller can fall back to claim_next()."""
        body = {"limit": int(limit)}
        if wait_seconds:
            body["wait_seconds"] = int(wait_seconds)
        try:
            response = self._claim_next_request(body, wait=wait_seconds)
        except (NotFound, InvalidRequest) as exc:
            if exc.status in (404, 405):  # a server without batch claim
                raise Unsupported(exc.status, exc.code, exc.detail) from None
            raise
        if response.status_code == 204 or not response.content:
            return []
        body = self._json(response)
        if isinstance(body, dict) and "claims" in body:
            return [Claim.from_payload(item) for item in body["claims"]]
        if isinstance(body, dict) and "job" in body:  # a server that ignored "limit"
            return [Claim.from_payload(body)]
        raise ServerError(response.status_code, "invalid_response", "Unexpected claim body.")

    def heartbeat(self, job_id: str, claim_id: str, *, timeout: float | None = None,
                  checkpoint: Any = None) -> Renewal:
        """Extend one lease (saving `checkpoint` with it, when not None, for the next
        attempt). Raises LeaseLost when the claim is no longer current."""
        body: dict[str, Any] = {"claim_id": claim_id}
        if checkpoint is not None:
            body["checkpoint"] = checkpoint
        response = self._request("POST", f"jobs/{job_id}/heartbeat", json=body,
                                 timeout=timeout)
        body = self._json(response)
        return Renewal(
            job_id=str(body.get("job_id", job_id)),
            renewed=True,
            claim_expires_at=parse_time(body["claim_expires_at"]),
            server_time=parse_time(body.get("server_time") or body["claim_expires_at"]),
        )

    def heartbeat_batch(self, claims: list[tuple[str, str]], *,
                        timeout: float | None = None) -> list[Renewal]:
        """Extend several leases of this agent at once: [(job_id, claim_id), ...].
        Raises Unsupported (404/405) when the server has no agent-level heartbeat."""
        payload = {"claims": [{"job_id": j, "claim_id": c} for j, c in claims]}
        try:
            response = self._request("POST", self._agent_path("heartbeat"), json=payload,
                                     timeout=timeout)
        except (NotFound, InvalidRequest) as exc:
            if exc.status in (404, 405):
                raise Unsupported(exc.status, exc.code, exc.detail) from None
            raise
        body = self._json(response)
        server_time = parse_time(body["server_time"]) if body.get("server_time") else None
        out = []
        for item in body.get("results", []):
            renewed = bool(item.get("renewed"))
            out.append(Renewal(
                job_id=str(item["job_id"]),
                renewed=renewed,
                claim_expires_at=parse_time(item["claim_expires_at"]) if renewed else None,
                server_time=server_time,
                code="" if renewed else str(item.get("code") or "claim_superseded"),
            ))
        return out

    def report(self, job_id: str, claim_id: str, status: str, *, message: str | None = None,
               result: Any = None, external_id: str | None = None,
               retry: bool = False) -> dict:
        """PUT the job's status (in_progress, successful, failure, cancelled). Returns the job.
        An identical retried terminal report answers 200 again, so retrying is safe.

        `retry=True` (with failure) is a retryable failure: the server queues the job again
        after a backoff while attempts remain (the job answered is then `queued`)."""
        body: dict[str, Any] = {"claim_id": claim_id, "status": status}
        if retry:
            body["retry"] = True
        if message is not None:
            body["message"] = message
        if result is not None:
            body["result"] = result
        if external_id is not None:
            body["external_id"] = external_id
        return self._json(self._request("PUT", f"jobs/{job_id}/status", json=body))

    def report_batch(self, reports: list[dict]) -> list[ApiError | None]:
        """End several jobs of this agent at once: each item {"job_id", "claim_id",
        "status", "message"?, "result"?, "retry"?}. Returns, per item in order, None when accepted
        (a retried identical report is accepted again) or the error the single report would
        have raised (LeaseLost, NotFound). Raises Unsupported (404/405) when the server has
        no batch report, and any request-level error as report() would."""
        try:
            response = self._request("POST", self._agent_path("reports"),
                                     json={"reports": reports})
        except (NotFound, InvalidRequest) as exc:
            if exc.status in (404, 405):
                raise Unsupported(exc.status, exc.code, exc.detail) from None
            raise
        body = self._json(response)
        results = body.get("results") if isinstance(body, dict) else None
        if not isinstance(results, list) or len(results) != len(reports):
            raise ServerError(response.status_code, "invalid_response",
                              "Unexpected batch report body.")
        out: list[ApiError | None] = []
        for item in results:
            if item.get("accepted"):
                out.append(None)
            elif item.get("code") == "not_found":
                out.append(NotFound(404, "not_found", "No such job."))
            else:
                code = str(item.get("code") or "claim_superseded")
                cls = DeadlineExceeded if code == "deadline_exceeded" else LeaseLost
                out.append(cls(409, code, "The report was refused."))
        return out

    def claim_state(self, job_id: str, claim_id: str) -> dict:
        """Is this claim still current? Read-only: it never extends the lease. Returns
        {"current": True, "lease_state", ...} or {"current": False, "code", "final_status"?}
        (final_status: how the job ended, when this claim's own report ended it)."""
        return self._json(self._request("GET", f"jobs/{job_id}/claims/{claim_id}"))

    # -- the effect ledger (docs/effects.md) --

    def _effect_request(self, method: str, path: str, body: dict) -> dict:
        for send in range(1, EFFECT_SENDS + 1):
            try:
                return self._json(self._request(method, path, json=body))
            except ApiError as exc:
                if not exc.transient or send == EFFECT_SENDS:
                    raise
                time.sleep(min(5.0, exc.retry_after if exc.retry_after is not None
                               else 0.2 * send))
        raise AssertionError("unreachable")  # pragma: no cover

    def begin_effect(self, job_id: str, claim_id: str, key: str) -> Effect:
        """POST jobs/{id}/effects/{key}/begin: begin the effect `key` for this claim's
        attempt, or learn that an earlier attempt did (Effect.state). Raises LeaseLost when
        the claim is no longer current, InvalidRequest for a bad key."""
        check_effect_key(key)
        answer = self._effect_request("POST", f"jobs/{job_id}/effects/{key}/begin",
                                      {"claim_id": claim_id})
        return Effect(key, answer, lambda result: self._commit_answer(
            job_id, claim_id, key, result))

    def _commit_answer(self, job_id: str, claim_id: str, key: str, result: Any) -> dict:
        try:  # NaN, Infinity, or not JSON at all: the request is wrong, not unanswered
            json.dumps(result, allow_nan=False)
        except (ValueError, TypeError, RecursionError) as exc:
            raise InvalidRequest(400, "invalid_request",
                                 f"the result is not JSON: {exc}") from None
        return self._effect_request("PUT", f"jobs/{job_id}/effects/{key}",
                                    {"claim_id": claim_id, "result": result})

    def commit_effect(self, job_id: str, claim_id: str, key: str, result: Any) -> Effect:
        """PUT jobs/{id}/effects/{key}: record `result` as the outcome of the effect `key`
        this attempt began. Raises EffectNotBegun (not begun by this attempt),
        EffectAlreadyCommitted (another result is recorded), LeaseLost (the claim is no
        longer current; nothing recorded)."""
        check_effect_key(key)
        return Effect(key, self._commit_answer(job_id, claim_id, key, result))

    @contextlib.contextmanager
    def effect(self, claim: Claim, key: str):
        """Begin the effect `key` of the claimed job and hand over its Effect:

            with client.effect(claim, "charge-card") as fx:
                if fx.committed:
                    charge = fx.result          # done by an earlier attempt: not again
                else:                           # started, or unknown: reconcile
                    charge = provider.charge(..., idempotency_key=fx.effect_id)
                    fx.commit(charge)

        The block always runs (a `with` cannot skip it): look at `fx.committed`. Leaving it
        without `fx.commit()` (an exception, or not) records nothing: the entry stays begun,
        and the next attempt's begin answers `unknown` with the same effect_id."""
        yield self.begin_effect(claim.job_id, claim.claim_id, key)

    def run_effect(self, claim: Claim, key: str, fn) -> Any:
        """Do the effect `key` at most once across the job's attempts: begin it; when it is
        committed, return the recorded result without calling `fn`; else call `fn(effect)`
        (effect.state "started" or "unknown", effect.effect_id the idempotency key) and
        commit what it returns, which is returned. An exception from `fn` propagates and
        records nothing (the next attempt's begin answers `unknown`)."""
        fx = self.begin_effect(claim.job_id, claim.claim_id, key)
        if fx.committed:
            return fx.result
        return fx.commit(fn(fx))

    def append_log(self, job_id: str, claim_id: str, data: bytes, start: int) -> int:
        """Append `data` at byte `start` of the claim's attempt's log (GitLab's trace
        protocol: a resent chunk is accepted unchanged). Returns the log's length now; a
        chunk past the log's end is not kept and LogGap carries the server's length."""
        headers = {"X-Claim-Id": claim_id, "Content-Type": "text/plain; charset=utf-8"}
        if data:
            headers["Content-Range"] = f"bytes {start}-{start + len(data) - 1}/*"
        try:
            response = self._request("PATCH", f"jobs/{job_id}/log", content=data,
                                     headers=headers)
        except InvalidRequest as exc:
            if exc.status == 416:
                raise LogGap(exc.status, exc.code, exc.detail, length=exc.length) from None
            raise
        return int(self._json(response)["length"])

    def upload_artifact(self, job_id: str, claim_id: str, name: str, chunks, size: int, *,
                        timeout: float | None = None) -> dict:
        """PUT one file (`size` bytes from the iterable `chunks`), staged for the claim's
        attempt; the successful report publishes it. Returns {name, size, sha256, ...}."""
        headers = {"X-Claim-Id": claim_id, "Content-Type": "application/octet-stream",
                   "Content-Length": str(size)}
        return self._json(self._request("PUT", f"jobs/{job_id}/artifacts/{name}",
                                        content=chunks, headers=headers, timeout=timeout))

    def release(self, job_id: str, claim_id: str, *, reason: str | None = None,
                retry_after_seconds: int | None = None) -> dict:
        """Give the job back to the queue. Returns the job (status queued)."""
        body: dict[str, Any] = {"claim_id": claim_id}
        if reason:
            body["reason"] = reason
        if retry_after_seconds is not None:
            body["retry_after_seconds"] = int(retry_after_seconds)
        return self._json(self._request("POST", f"jobs/{job_id}/release", json=body))
