"""A small synchronous HTTP client for the producer side of the v1 API (httpx).

The agent client's sibling (client.py): the same transport (`ApiClient`, transport.py), the
same typed errors (`ApiError` and its subclasses, each carrying the server's stable `code`:
errors.py), the same retry rule: a request is sent again after a lost answer (a transport
error or a 5xx) only where the server answers a repeat as it answered the first: reads (GET),
a `create_job` that carries an `Idempotency-Key` (a replay answers the first job), a cancel
(a cancelled job's cancel answers it unchanged) and a rate limit's PUT (it sets the same
limit). Requeues, dispatches and group cancels are
sent once: a repeat of one that landed would requeue again, answer 409 `invalid_transition`,
or count 0.

It authenticates with a workspace API key (`X-API-Key`), which acts for the whole workspace.
Importable without Django, like the rest of the package. One client may be shared by several
threads.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import math
import os
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote

import httpx

from .errors import (
    ApiError,
    Conflict,
    InvalidRequest,
    ServerError,
    Throttled,
    TransportError,
    error_from_response,
)
from .transport import ApiClient

TERMINAL_STATUSES = frozenset({"successful", "failure", "cancelled", "expired"})

# A safe request (a read, a create with an Idempotency-Key) whose answer is lost is sent this
# many times in all, as AgentClient does with a claim-next.
SENDS = 3
# The server's default bound on wait_seconds (JOBQUEUE_MAX_CLAIM_WAIT_SECONDS); a server
# with a lower one answers 400 naming wait_seconds, and wait() asks for half as long.
MAX_WAIT_SECONDS = 50
DOWNLOAD_CHUNK = 1024 * 1024


# --- errors (producer-side refinements of client.py's) ----------------------------------


class JobFinished(Conflict):
    """409 job_finished: a cancel of a job that had already ended otherwise (successful,
    failure, expired; cancelling a cancelled job answers it unchanged)."""


class GroupCancelled(Conflict):
    """409 group_cancelled: a create into a cancelled group, or a requeue of one of its jobs.
    The run is over: start a new group."""


class UniqueKeyConflict(Conflict):
    """409 unique_key_conflict: a create with on_conflict="replace" or debounce_seconds whose
    unique_key met a live job of another job agent (the detail names it). Nothing changed and
    nothing was created: put the agent in the key, or create without replace or debounce."""


class InvalidTransition(Conflict):
    """409 invalid_transition: a requeue of a pending job, a dispatch of a non-pending one."""


class IdempotencyKeyReused(InvalidRequest):
    """422 idempotency_key_reused: the key was first sent with another body."""


class ChecksumMismatch(ServerError):
    """A downloaded artifact whose bytes do not hash to its ETag (sha256). Nothing is left
    at the destination path; the download may be retried."""


class WaitTimeout(TimeoutError):
    """wait() ran out of time before the job ended; `job` is the job as last seen."""

    def __init__(self, job: dict, timeout: float):
        self.job = job
        super().__init__(f"job {job.get('id')} is still {job.get('status')} after {timeout}s")


_CONFLICTS = {"job_finished": JobFinished, "group_cancelled": GroupCancelled,
              "invalid_transition": InvalidTransition, "unique_key_conflict": UniqueKeyConflict}


def producer_error_from_response(response: httpx.Response) -> ApiError:
    """As client.error_from_response, except that no 409 is about a lease here: every 409 is
    a Conflict (JobFinished, GroupCancelled, InvalidTransition, UniqueKeyConflict, else
    Conflict itself), and
    422 idempotency_key_reused is IdempotencyKeyReused."""
    exc = error_from_response(response)
    if exc.status == 409:
        cls = _CONFLICTS.get(exc.code, Conflict)
    elif exc.status == 422 and exc.code == "idempotency_key_reused":
        cls = IdempotencyKeyReused
    else:
        return exc
    return cls(exc.status, exc.code, exc.detail, fields=exc.fields,
               retry_after=exc.retry_after, length=exc.length)


# --- results -----------------------------------------------------------------------------


@dataclass(frozen=True)
class LogChunk:
    """A piece of an attempt's log: `data` from byte `offset`; `length` is the whole log's
    length when the server answered (read again from `next_offset` to follow it)."""

    data: bytes
    attempt: int
    offset: int
    length: int

    @property
    def next_offset(self) -> int:
        return self.offset + len(self.data)

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


def _segment(value: Any) -> str:
    """One path segment: a job id, a group or an artifact name, percent-encoded."""
    return quote(str(value), safe="")


def _key_segment(key: str) -> str:
    """A rate limit's key as the rest of the path: percent-encoded, its dots too (a key "."
    or ".." sent as it is would be resolved away by the URL, as a path's dot segments are)."""
    return quote(str(key), safe="").replace(".", "%2E")


def _timestamp(value: dt.datetime | str) -> str:
    if isinstance(value, str):
        return value
    if value.tzinfo is None:  # as parse_time reads the server's: naive is UTC
        value = value.replace(tzinfo=dt.UTC)
    return value.isoformat()


# --- the client --------------------------------------------------------------------------


class ProducerClient(ApiClient):
    """The producer's view of the API: create jobs, look at them (and ask why one is not
    running) and wait for their end, cancel, requeue and dispatch them, follow groups, read
    logs and download artifacts, and manage cron schedules and rate limits."""

    error_from_response = staticmethod(producer_error_from_response)

    def __init__(self, server: str, workspace_id: str, api_key: str, *,
                 timeout: float = 10.0, transport: httpx.BaseTransport | None = None,
                 user_agent: str | None = "jobqueue-producer", sends: int = SENDS,
                 max_wait_seconds: int = MAX_WAIT_SECONDS):
        super().__init__(server, workspace_id, {"X-API-Key": api_key}, timeout=timeout,
                         transport=transport, user_agent=user_agent)
        self.sends = max(1, int(sends))
        self.max_wait_seconds = max(1, int(max_wait_seconds))

    def __repr__(self) -> str:  # never print the key
        return f"ProducerClient(server={self.server!r}, workspace={self.workspace_id!r})"

    # -- plumbing --

    def _safe_request(self, method: str, path: str, **kwargs) -> httpx.Response:
        """A request the server answers the same when repeated: sent again (up to `sends`
        in all) when its answer is lost or is a 5xx."""
        for send in range(1, self.sends + 1):
            try:
                return self._request(method, path, **kwargs)
            except (TransportError, ServerError):
                if send == self.sends or (self._aborted and kwargs.get("wait")):
                    raise
                time.sleep(0.05 * send)
        raise AssertionError("unreachable")  # pragma: no cover -- the loop returns or raises

    def _get(self, path: str, **kwargs) -> Any:
        return self._json(self._safe_request("GET", path, **kwargs))

    def _post(self, path: str, body: dict | None = None) -> Any:
        return self._json(self._request("POST", path, json=body or {}))

    # -- jobs --

    def create_job(self, job_agent_id: str | None = None, *, labels: list[str] | None = None,
                   job_agent_config: dict | None = None,
                   dispatch_context: dict | None = None, priority: int | None = None,
                   max_attempts: int | None = None, delay_seconds: int | None = None,
                   retry_backoff_seconds: int | None = None,
                   max_runtime_seconds: int | None = None,
                   expires_at: dt.datetime | str | None = None,
                   external_id: str | None = None, group: str | None = None,
                   hold: bool = False, idempotency_key: str | None = None,
                   unique_key: str | None = None, unique_states: list[str] | None = None,
                   on_conflict: str | None = None, debounce_seconds: int | None = None,
                   debounce_max_seconds: int | None = None,
                   depends_on: list[str] | None = None,
                   concurrency_key: str | None = None,
                   concurrency_limit: int | None = None,
                   rate_limit_key: str | None = None,
                   fairness_key: str | None = None) -> dict:
        """POST jobs: create a job for `job_agent_id`, or for `labels` (1 to 16: any job agent
        of the workspace whose labels include all of them may claim it), exactly one of the
        two (else ValueError, nothing sent); queued, `pending` with hold=True (see
        dispatch()). Returns the job (never its dispatch_context) with `deduplicated`. Fields
        left None are not sent, so the server's defaults apply (and, with an Idempotency-Key,
        they count as omitted in the key's fingerprint).

        With `unique_key`, while a job of the workspace with that key is live (pending,
        queued, in_progress; `unique_states` may narrow it), the create makes no other job
        and returns the live one with deduplicated=True; on_conflict="replace" updates an
        unclaimed one in place (dispatch_context, priority, available_at) and creates a new
        one beside an in_progress one. `debounce_seconds` (1..86400) pushes a queued job's
        start to that long after the last create that meets it (which also gives it its
        dispatch_context), at most `debounce_max_seconds` after its first create (the cap
        that create gave the job holds whatever later creates send), and never past the
        last start before its expires_at. A replace or a debounce that meets a live job of
        another job agent raises UniqueKeyConflict and changes nothing.

        With `depends_on` (1 to 100 job ids of the workspace), the job waits pending
        (`waiting_on`) until they are all successful, then is queued; it ends cancelled
        (message "dependency_failed: <id>") when one ends otherwise. Its claim carries
        `claim["parents"]`: each parent's job_id, status and result.

        With `concurrency_key` (1 to 255 characters), the job is claimed only while fewer
        than `concurrency_limit` (1 to 1000, default 1; only with a key) of the workspace's
        jobs with that key are in progress.

        With `rate_limit_key` (1 to 255 characters), the job is claimed only while the key's
        rate limit (set_rate_limit), if it has one, lets a claim through.

        With `fairness_key` (1 to 255 characters, e.g. a tenant), the claims of the
        workspace's jobs with fairness keys are shared among the keys in proportion to their
        weights (set_fairness_weight; 1 without one), whatever number of jobs each has queued.

        With `idempotency_key`, a replay with the same fields returns the first job, so a
        lost answer is sent again; the same key with other fields raises
        IdempotencyKeyReused. Without one, the request is sent once. Raises GroupCancelled
        for a cancelled group, InvalidRequest (400) for a bad field or an unknown agent."""
        if (job_agent_id is None) == (labels is None):
            raise ValueError("create_job: give exactly one of job_agent_id and labels")
        body: dict[str, Any] = ({"job_agent_id": str(job_agent_id)} if labels is None
                                else {"labels": [str(label) for label in labels]})
        optional = {
            "job_agent_config": job_agent_config, "dispatch_context": dispatch_context,
            "priority": priority, "max_attempts": max_attempts, "delay_seconds": delay_seconds,
            "retry_backoff_seconds": retry_backoff_seconds,
            "max_runtime_seconds": max_runtime_seconds,
            "expires_at": None if expires_at is None else _timestamp(expires_at),
            "external_id": external_id, "group": group, "unique_key": unique_key,
            "unique_states": None if unique_states is None else list(unique_states),
            "on_conflict": on_conflict, "debounce_seconds": debounce_seconds,
            "debounce_max_seconds": debounce_max_seconds,
            "depends_on": None if depends_on is None else [str(j) for j in depends_on],
            "concurrency_key": concurrency_key, "concurrency_limit": concurrency_limit,
            "rate_limit_key": rate_limit_key, "fairness_key": fairness_key,
        }
        body.update({k: v for k, v in optional.items() if v is not None})
        if hold:
            body["hold"] = True
        if idempotency_key is None:
            return self._json(self._request("POST", "jobs", json=body))
        return self._json(self._safe_request("POST", "jobs", json=body,
                                             headers={"Idempotency-Key": idempotency_key}))

    def create_flow(self, jobs: list[dict]) -> dict:
        """POST flows: create a graph of jobs at once, all or nothing. Each of `jobs` is a
        dict of create_job's body fields (job_agent_id, dispatch_context, group, …; not hold
        or the unique-job ones) with a `ref` (unique in the flow) and optionally
        `depends_on_refs` (refs of earlier jobs of the list) and `depends_on` (ids of
        existing jobs). Returns {ref: job} in the order sent. Raises InvalidRequest (400)
        for a bad flow: its `fields` name the job, e.g. "jobs[1].depends_on_refs". Sent
        once (a flow takes no Idempotency-Key)."""
        body = {"jobs": [dict(job) for job in jobs]}
        return self._json(self._request("POST", "flows", json=body))["jobs"]

    def get(self, job_id: str, *, wait_seconds: int | None = None) -> dict:
        """GET jobs/{job_id}: the job with its claim state (`claim`), `attempts` and timeline
        (`events`); `dispatch_context_keys` names its context's keys, never their values.

        With `wait_seconds` (0 to the server's JOBQUEUE_MAX_CLAIM_WAIT_SECONDS, 50 by
        default), the server holds the answer until the job is terminal or that many
        seconds have passed: check `status`. Raises NotFound for a job not in the workspace."""
        path = f"jobs/{_segment(job_id)}"
        if not wait_seconds:
            return self._get(path)
        wait = int(wait_seconds)
        return self._get(path, params={"wait_seconds": wait}, wait=wait)

    def explain_job(self, job_id: str) -> dict:
        """GET jobs/{job_id}/explain: why the job is not running, from the rule claims use:
        {"status", "claimable", "reasons": [{"code", "detail", …}], "agents": {"matching",
        "online"}}. `claimable` says whether a claim of an agent it is routed to would take
        it now; empty `reasons` with `claimable` true: the next such claim takes it
        (docs/api.md, "Why isn't my job running? (explain)"). Raises NotFound for a job not
        in the workspace."""
        return self._get(f"jobs/{_segment(job_id)}/explain")

    def wait(self, job_id: str, timeout: float | None = None, *,
             poll_seconds: int | None = None) -> dict:
        """Wait until the job is terminal and return it, holding one long-poll get() after
        another (each at most `poll_seconds`, default max_wait_seconds). `timeout` None waits
        for as long as it takes; past `timeout` seconds, WaitTimeout (a TimeoutError)
        carries the job as last seen.

        Errors that a later try may not meet (network, 5xx, 429) are retried with jittered
        exponential backoff until the deadline; any other error is raised. A server with a
        lower bound on wait_seconds (its 400 names wait_seconds) is asked for half as long
        (and this client's max_wait_seconds keeps it);
        one that answers a wait early (at its cap of held waits) is asked again after a
        pause, as agents do."""
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        longest = max(1, int(poll_seconds or self.max_wait_seconds))
        failures = early = 0
        job: dict | None = None
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            wait = longest if left is None else min(longest, math.ceil(max(0.0, left)))
            started = time.monotonic()
            try:
                job = self.get(job_id, wait_seconds=wait)
                failures = 0
            except InvalidRequest as exc:
                if "wait_seconds" not in exc.fields or longest == 1:
                    raise
                # Kept for the later waits of this client, which then ask within the bound.
                longest = self.max_wait_seconds = max(1, longest // 2)
                continue
            except ApiError as exc:
                if not exc.transient or self._aborted:
                    raise
                failures += 1
                pause = _backoff(failures)
                if isinstance(exc, Throttled) and exc.retry_after is not None:
                    pause = exc.retry_after
                if deadline is not None and deadline - time.monotonic() <= pause:
                    if job is None:
                        raise
                    raise WaitTimeout(job, timeout) from exc
                time.sleep(pause)
                continue
            if job.get("status") in TERMINAL_STATUSES:
                return job
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise WaitTimeout(job, timeout)
            if time.monotonic() - started < wait / 2:  # answered early: do not spin
                early += 1
                time.sleep(_backoff(early) if left is None else min(left, _backoff(early)))
            else:
                early = 0

    def list_page(self, *, status: str | None = None, group: str | None = None,
                  job_agent_id: str | None = None, cursor: str | None = None,
                  page_size: int | None = None) -> dict:
        """GET jobs: one page, newest first, {"results", "next", "previous"}. Items are job
        summaries (no job_agent_config, result or message: get() has them)."""
        params: dict[str, Any] = {}
        if status is not None:
            params["status"] = status
        if group is not None:
            params["group"] = group
        if job_agent_id is not None:
            params["job_agent_id"] = str(job_agent_id)
        if cursor is not None:
            params["cursor"] = cursor
        if page_size is not None:
            params["page_size"] = int(page_size)
        return self._get("jobs", params=params)

    def list(self, *, status: str | None = None, group: str | None = None,
             job_agent_id: str | None = None, page_size: int | None = None,
             limit: int | None = None) -> Iterator[dict]:
        """Every job that matches (or the first `limit`), newest first, following the
        cursor from page to page; pages are fetched as the iteration reaches them."""
        cursor = None
        given = 0
        while True:
            page = self.list_page(status=status, group=group, job_agent_id=job_agent_id,
                                  cursor=cursor, page_size=page_size)
            for job in page.get("results", []):
                if limit is not None and given >= limit:
                    return
                given += 1
                yield job
            # `next` is a URL built from the request's own host; only its cursor is kept,
            # so that every page goes to this client's server (behind a proxy too).
            cursor = httpx.URL(page["next"]).params.get("cursor") if page.get("next") else None
            if not cursor or (limit is not None and given >= limit):
                return

    def cancel(self, job_id: str, reason: str | None = None) -> dict:
        """POST jobs/{job_id}/cancel: end the job as `cancelled`, even while an agent holds
        it (its next write gets 409 job_cancelled). Returns the job; a cancelled job is
        answered unchanged, so a lost answer is sent again. Raises JobFinished for
        a job that had ended otherwise (successful, failure, expired)."""
        return self._json(self._safe_request("POST", f"jobs/{_segment(job_id)}/cancel",
                                             json=_reason(reason)))

    def requeue(self, job_id: str, reason: str | None = None) -> dict:
        """POST jobs/{job_id}/requeue: queue the job again now, with as many further
        attempts as it was created with (a live claim is superseded). Returns the job.
        Raises InvalidTransition for a pending job, GroupCancelled in a cancelled group."""
        return self._post(f"jobs/{_segment(job_id)}/requeue", _reason(reason))

    def dispatch(self, job_id: str) -> dict:
        """POST jobs/{job_id}/dispatch: make a held (`pending`) job `queued`. Returns the
        job. Raises InvalidTransition when the job is not pending."""
        return self._json(self._request("POST", f"jobs/{_segment(job_id)}/dispatch"))

    # -- groups --

    def group(self, name: str) -> dict:
        """GET groups/{name}: {"group", "counts": {status: n}, "finished", "cancelled_at"}.
        Raises NotFound when no job of the workspace ever had that group."""
        return self._get(f"groups/{_segment(name)}")

    def cancel_group(self, name: str, reason: str | None = None) -> int:
        """POST groups/{name}/cancel: cancel every live job of the group and refuse new ones
        (GroupCancelled). Returns how many jobs this call cancelled (0 on a repeat)."""
        body = self._post(f"groups/{_segment(name)}/cancel", _reason(reason))
        return int(body["cancelled"])

    # -- schedules --

    def create_schedule(self, name: str, cron: str, job: dict, *, timezone: str | None = None,
                        overlap: str | None = None,
                        catchup_window_seconds: int | None = None,
                        paused: bool | None = None) -> dict:
        """POST schedules: a cron schedule; maintenance creates `job` (the body of POST jobs,
        with its job_agent_id) at each fire time of `cron` in `timezone` (IANA, default UTC).
        `overlap`: skip (default; nothing while its previous job is live), buffer_one
        (nothing while one of its jobs waits unclaimed) or allow. `catchup_window_seconds`
        (0 to 604800, default 60): how late a fire time missed while maintenance was down is
        still made up. Returns the schedule with its `next_fire_times`. Sent once (a retry
        would meet the first as a name already taken: InvalidRequest naming `name`)."""
        body: dict[str, Any] = {"name": name, "cron": cron, "job": dict(job)}
        optional = {"timezone": timezone, "overlap": overlap,
                    "catchup_window_seconds": catchup_window_seconds, "paused": paused}
        body.update({k: v for k, v in optional.items() if v is not None})
        return self._json(self._request("POST", "schedules", json=body))

    def get_schedule(self, schedule_id: str) -> dict:
        """GET schedules/{id}: the schedule, its `next_fire_times` (the next 5, UTC), its last
        fire and job, its fires by outcome. Its job shows dispatch_context_keys only."""
        return self._get(f"schedules/{_segment(schedule_id)}")

    def list_schedules(self, *, page_size: int | None = None,
                       limit: int | None = None) -> Iterator[dict]:
        """GET schedules: every schedule of the workspace (or the first `limit`), newest
        first, page after page."""
        cursor, given = None, 0
        while True:
            params: dict[str, Any] = {}
            if cursor is not None:
                params["cursor"] = cursor
            if page_size is not None:
                params["page_size"] = int(page_size)
            page = self._get("schedules", params=params)
            for schedule in page.get("results", []):
                if limit is not None and given >= limit:
                    return
                given += 1
                yield schedule
            cursor = httpx.URL(page["next"]).params.get("cursor") if page.get("next") else None
            if not cursor or (limit is not None and given >= limit):
                return

    def update_schedule(self, schedule_id: str, **changes: Any) -> dict:
        """PATCH schedules/{id}: change `name`, `cron`, `timezone`, `job` (a whole POST jobs
        body), `overlap`, `catchup_window_seconds` or `paused`. A new cron or time zone, and
        a resume, fire next at the first fire time after now. Returns the schedule."""
        return self._json(self._safe_request("PATCH", f"schedules/{_segment(schedule_id)}",
                                             json=changes))

    def pause_schedule(self, schedule_id: str) -> dict:
        """PATCH schedules/{id} {"paused": true}: it fires nothing until resumed."""
        return self.update_schedule(schedule_id, paused=True)

    def resume_schedule(self, schedule_id: str) -> dict:
        """PATCH schedules/{id} {"paused": false}: it fires again from its next fire time
        after now (what it would have fired while paused is not made up)."""
        return self.update_schedule(schedule_id, paused=False)

    def trigger_schedule(self, schedule_id: str) -> dict:
        """POST schedules/{id}/trigger: fire now, paused or not, whatever its overlap: the
        job (with `deduplicated`), which counts as the schedule's latest. Sent once."""
        return self._json(self._request("POST", f"schedules/{_segment(schedule_id)}/trigger"))

    def delete_schedule(self, schedule_id: str) -> None:
        """DELETE schedules/{id}: the schedule and its fires' records; its jobs stay."""
        self._request("DELETE", f"schedules/{_segment(schedule_id)}")

    # -- rate limits --

    def set_rate_limit(self, key: str, count: int, period_seconds: int) -> dict:
        """PUT rate-limits/{key}: the workspace's jobs with `rate_limit_key` `key` (1 to 255
        printable characters, any of them: the key is percent-encoded here) are claimed only
        while fewer than `count` (1 to 100000) of them were claimed in the last
        `period_seconds` (1 to 86400). Creates or replaces the key's limit; returns it,
        {"key", "count", "period_seconds", "created_at", "updated_at"}. Sent again after a
        lost answer (the same PUT sets the same limit). Raises InvalidRequest (400) naming
        `key`, `count` or `period_seconds`."""
        return self._json(self._safe_request(
            "PUT", f"rate-limits/{_key_segment(key)}",
            json={"count": count, "period_seconds": period_seconds}))

    def get_rate_limit(self, key: str) -> dict:
        """GET rate-limits/{key}: the key's limit. Raises NotFound when it has none (then it
        limits nothing)."""
        return self._get(f"rate-limits/{_key_segment(key)}")

    def delete_rate_limit(self, key: str) -> None:
        """DELETE rate-limits/{key}: remove the key's limit; its held-back jobs become
        claimable. Raises NotFound when it had none. Sent once (a repeat of one that landed
        would answer NotFound)."""
        self._request("DELETE", f"rate-limits/{_key_segment(key)}")

    def list_rate_limits(self, *, page_size: int | None = None,
                         limit: int | None = None) -> Iterator[dict]:
        """GET rate-limits: every rate limit of the workspace (or the first `limit`), by key,
        page after page."""
        return self._pages("rate-limits", page_size, limit)

    # -- fair shares --

    def set_fairness_weight(self, key: str, weight: int) -> dict:
        """PUT fairness-keys/{key}: the weight (1 to 100) of the workspace's `fairness_key`
        `key` (1 to 255 printable characters, any of them: the key is percent-encoded here):
        the claims of jobs with fairness keys are shared among the keys in proportion to
        their weights (a key without one weighs 1). Creates or replaces it; returns it,
        {"key", "weight", "created_at", "updated_at"}. Sent again after a lost answer (the
        same PUT sets the same weight). Raises InvalidRequest (400) naming `key` or
        `weight`."""
        return self._json(self._safe_request(
            "PUT", f"fairness-keys/{_key_segment(key)}", json={"weight": weight}))

    def get_fairness_weight(self, key: str) -> dict:
        """GET fairness-keys/{key}: the key's weight. Raises NotFound when none is set (then
        it weighs 1)."""
        return self._get(f"fairness-keys/{_key_segment(key)}")

    def delete_fairness_weight(self, key: str) -> None:
        """DELETE fairness-keys/{key}: remove the key's weight (it weighs 1 again). Raises
        NotFound when none was set. Sent once (a repeat of one that landed would answer
        NotFound)."""
        self._request("DELETE", f"fairness-keys/{_key_segment(key)}")

    def list_fairness_keys(self, *, page_size: int | None = None,
                           limit: int | None = None) -> Iterator[dict]:
        """GET fairness-keys: every weight set in the workspace (or the first `limit`), by
        key, page after page."""
        return self._pages("fairness-keys", page_size, limit)

    def _pages(self, path: str, page_size: int | None, limit: int | None) -> Iterator[dict]:
        """The items of a keyset listing, page after page (fetched as the iteration reaches
        them), up to `limit`; only the cursor of `next` is kept (its host is the request's)."""
        cursor, given = None, 0
        while True:
            params: dict[str, Any] = {}
            if cursor is not None:
                params["cursor"] = cursor
            if page_size is not None:
                params["page_size"] = int(page_size)
            page = self._get(path, params=params)
            for item in page.get("results", []):
                if limit is not None and given >= limit:
                    return
                given += 1
                yield item
            cursor = httpx.URL(page["next"]).params.get("cursor") if page.get("next") else None
            if not cursor or (limit is not None and given >= limit):
                return

    # -- outputs --

    def read_log(self, job_id: str, *, attempt: int | None = None,
                 offset: int = 0) -> LogChunk:
        """GET jobs/{job_id}/log: an attempt's log (default: the latest attempt's) from byte
        `offset`; readable while the attempt runs. An attempt without a log reads empty."""
        params: dict[str, Any] = {}
        if attempt is not None:
            params["attempt"] = int(attempt)
        if offset:
            params["offset"] = int(offset)
        # Sent with the client's Accept (JSON): the API negotiates its error answers on it.
        response = self._safe_request("GET", f"jobs/{_segment(job_id)}/log", params=params)
        length = response.headers.get("X-Log-Length", "")
        got = response.headers.get("X-Log-Attempt", "")
        return LogChunk(
            data=response.content,
            attempt=int(got) if got.isdigit() else int(attempt or 0),
            offset=int(offset),
            length=int(length) if length.isdigit() else int(offset) + len(response.content),
        )

    def list_artifacts(self, job_id: str) -> list[dict]:
        """GET jobs/{job_id}/artifacts: the published set (what the successful attempt
        uploaded), each {"name", "size", "sha256", "attempt", "content_type"}."""
        return self._get(f"jobs/{_segment(job_id)}/artifacts")["results"]

    def list_effects(self, job_id: str) -> list[dict]:
        """GET jobs/{job_id}/effects: the job's effect ledger, oldest first, each {"effect_id",
        "key", "state" (started or committed), "attempt", "earlier_attempt", "begun_at",
        "committed_attempt", "committed_at", "result"} (docs/effects.md)."""
        return self._get(f"jobs/{_segment(job_id)}/effects")["results"]

    def download_artifact(self, job_id: str, name: str,
                          dest: str | os.PathLike | IO[bytes]) -> dict:
        """GET jobs/{job_id}/artifacts/{name}, streamed (never held in memory) into `dest`:
        a path (written to a temporary file beside it, renamed into place once complete and
        checked) or a binary file object (written as it comes). The bytes are hashed on the
        way and compared with the answer's ETag (the artifact's sha256): a mismatch raises
        ChecksumMismatch (and leaves no file at a path). Returns {"name", "size",
        "sha256"}. Raises NotFound for an artifact that is not published."""
        path = None if hasattr(dest, "write") else Path(dest)
        response = None
        for send in range(1, self.sends + 1):  # pragma: no branch -- it breaks or raises
            try:
                response = self._request(
                    "GET", f"jobs/{_segment(job_id)}/artifacts/{_segment(name)}", stream=True)
                break
            except (TransportError, ServerError):
                if send == self.sends:
                    raise
                time.sleep(0.05 * send)
        assert response is not None
        tmp = None
        try:
            if path is None:
                out = dest
            else:
                tmp = path.with_name(f".{path.name}.{os.getpid()}.{random.randrange(1 << 32):x}"
                                     ".part")
                out = open(tmp, "wb")  # noqa: SIM115 - closed below
            digest, size = hashlib.sha256(), 0
            try:
                for chunk in response.iter_bytes(DOWNLOAD_CHUNK):
                    digest.update(chunk)
                    size += len(chunk)
                    out.write(chunk)
            except httpx.TransportError as exc:
                raise TransportError.of(exc) from None
            finally:
                if path is not None:
                    out.close()
            sha256 = digest.hexdigest()
            expected = response.headers.get("ETag", "").strip('"')
            if expected and expected != sha256:
                raise ChecksumMismatch(response.status_code, "checksum_mismatch",
                                       f"The artifact's bytes hash to {sha256}, not its ETag.")
            if tmp is not None:
                os.replace(tmp, path)
                tmp = None
            return {"name": name, "size": size, "sha256": sha256}
        finally:
            response.close()
            if tmp is not None:
                tmp.unlink(missing_ok=True)


def _backoff(n: int) -> float:
    """The pause after the n-th failure in a row: 0.5 s doubling up to 30 s, jittered +-20 %."""
    return min(30.0, 0.5 * 2 ** min(n - 1, 6)) * random.uniform(0.8, 1.2)


def _reason(reason: str | None) -> dict:
    return {"reason": reason} if reason else {}
