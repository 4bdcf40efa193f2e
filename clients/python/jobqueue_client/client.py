"""A small synchronous HTTP client for the agent side of the v1 API (httpx): `AgentClient`,
and what it answers (`Claim`, `Renewal`, `Effect`).

Importable without Django: it imports nothing from `django` or `jobqueue`. Every error the
server answers becomes an `ApiError` subclass carrying the response's stable `code`, so callers
branch on types (or `code`), never on text. Network failures become `TransportError`. The
errors live in errors.py and the transport both clients share (`ApiClient`) in transport.py;
both are re-exported here, where callers have always imported them from.

One client may be shared by several threads (httpx.Client pools its connections).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx

from . import version
from .errors import (
    LEASE_LOST_CODES,
    ApiError,
    AuthError,
    Conflict,
    DeadlineExceeded,
    EffectAlreadyCommitted,
    EffectNotBegun,
    InvalidRequest,
    LeaseLost,
    LogGap,
    NotClaimable,
    NotFound,
    ServerError,
    Throttled,
    TransportError,
    Unsupported,
    error_class,
    error_from_response,
)
from .transport import ApiClient

# The errors and the transport, for `from jobqueue_client.client import ...` (effects.py,
# producer code and users import them from here).
__all__ = [
    "LEASE_LOST_CODES", "AgentClient", "ApiClient", "ApiError", "AuthError", "Claim",
    "Conflict", "DeadlineExceeded", "Effect", "EffectAlreadyCommitted", "EffectNotBegun",
    "InvalidRequest", "LeaseLost", "LogGap", "NotClaimable", "NotFound", "Renewal",
    "ServerError", "Throttled", "TransportError", "Unsupported", "check_effect_key",
    "default_holder", "error_class", "error_from_response", "parse_time",
]


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
    # The jobs this one depends on, each {"job_id", "status", "result"} (their results: an
    # extract's for its load); [] for a job without dependencies (or an older server).
    parents: list = field(default_factory=list, repr=False)

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
            parents=list(claim.get("parents") or []),
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
        # (the body, the Idempotency-Key) of a claim request whose every send's answer was
        # lost: the next claim request with that body sends that key again.
        self._pending_claim: tuple[dict | None, str | None] = (None, None)
        self.agent_id = str(agent_id)

    def __repr__(self) -> str:  # never print the token
        return f"AgentClient(server={self.server!r}, agent={self.agent_id!r})"

    def _agent_path(self, suffix: str) -> str:
        return f"job-agents/{self.agent_id}/{suffix}"

    # -- its token --

    def rotate_token(self, overlap_seconds: int = 300) -> tuple[dict, str | None]:
        """Rotate this client's token (POST job-agents/{id}/tokens/rotate): the answer (the
        new `token`, `token_expires_at`, `previous_token_expires_at`) and its Date header.
        The client keeps sending the old token until set_token(): store the new one first."""
        response = self._request("POST", self._agent_path("tokens/rotate"),
                                 json={"overlap_seconds": int(overlap_seconds)})
        return self._json(response), response.headers.get("Date")

    def set_token(self, token: str) -> None:
        """Send `token` from the next request on (held waits already sent keep theirs)."""
        value = f"Bearer {token}"
        self._http.headers["Authorization"] = value
        with self._wait_lock:
            if self._wait_http is not None:
                self._wait_http.headers["Authorization"] = value

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
        the claim(s) the first one made instead of handing out more jobs. When every send's
        answer is lost (a restart of the server, a network outage), the key is kept for the
        next claim request with the same body, until one is answered: the claims the lost
        sends made are handed back then, not left to wait for their leases to run out (the
        server keeps a key while its claims live; after that, it claims anew)."""
        key = self._pending_claim[1] if self._pending_claim[0] == body else None
        headers = {"Idempotency-Key": key or f"claim-{uuid.uuid4().hex}"}
        for send in range(1, self.claim_sends + 1):
            try:
                response = self._request("POST", self._agent_path("jobs/claim"),
                                         json=self._with_holder(body), headers=headers,
                                         wait=wait)
            except (TransportError, ServerError):
                if send == self.claim_sends:
                    self._pending_claim = (dict(body), headers["Idempotency-Key"])
                    raise
                time.sleep(0.05 * send)
            except ApiError:
                self._pending_claim = (None, None)  # answered: that key made no claim
                raise
            else:
                self._pending_claim = (None, None)
                return response
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


def register(server: str, registration_token: str, name: str, labels=None, *,
             timeout: float = 10.0, transport: httpx.BaseTransport | None = None,
             user_agent: str | None = "jobqueue-agent") -> tuple[dict, str | None]:
    """POST /v1/register: a new job agent named `name` (with `labels`, a subset of the
    registration token's; None: the token's) and its token. Returns the answer
    (`workspace_id`, `job_agent`, `token`, `token_expires_at`, `settings`) and its Date
    header. Raises AuthError (401 registration_token_invalid, 403 labels_not_allowed),
    Conflict (409 agent_name_taken), InvalidRequest, Throttled, TransportError."""
    body: dict[str, Any] = {"registration_token": registration_token, "name": name}
    if labels is not None:
        body["labels"] = list(labels)
    with httpx.Client(base_url=f"{server.rstrip('/')}/v1/", timeout=timeout,
                      transport=transport,
                      headers={"Accept": "application/json",
                               "User-Agent": version.user_agent(user_agent)}) as http:
        try:
            response = http.post("register", json=body)
        except httpx.TransportError as exc:
            raise TransportError.of(exc) from None
    if response.status_code >= 400:
        raise error_from_response(response)
    return ApiClient._json(response), response.headers.get("Date")
