"""A job's attempts, derived from its timeline (job_event): no row is written for them, so
the claim and report hot paths write nothing more than before.

Each `claimed` event opens an attempt (its number and claim_id); the event that ended that
claim (the same claim_id) closes it with its outcome:

    status_reported  successful | failure | cancelled (the agent's report), retrying (a
                     retryable failure that queued the job again), superseded (an
                     operator's mark-failed while it ran)
    released         released (message: the agent's reason)
    reaped, expired  reaped (the lease ran out)
    timed_out        timed_out (max_runtime_seconds or expires_at ended it)
    cancelled        cancelled (an operator cancelled it while it ran)
    requeued         superseded (an operator requeued it while it ran)

An attempt still running has no `ended_at` and no outcome. The latest claim's `claimed`
and an agent's final report may be read from the job row rather than stored
(jobqueue/timeline.py): they open and close the last attempt the same way. Cost: one indexed
query of the job's events of these kinds (job_event's job_id index), in time order, and the
timeline's one query of its last claim's stored events, on the job's page only.
"""

from __future__ import annotations

from dataclasses import dataclass

from .models import Job, JobEvent
from .timeline import TIME_ORDER, merged, said, stored_events

MAX_ATTEMPTS_SHOWN = 100

_ENDS = {
    JobEvent.RELEASED: "released",
    JobEvent.REAPED: "reaped",
    JobEvent.EXPIRED: "reaped",
    JobEvent.TIMED_OUT: "timed_out",
    JobEvent.CANCELLED: "cancelled",
    JobEvent.REQUEUED: "superseded",
}
_MESSAGES = {
    JobEvent.REAPED: "The lease expired.",
    JobEvent.EXPIRED: "The lease expired on the last attempt.",
}
KINDS = [JobEvent.CLAIMED, JobEvent.STATUS_REPORTED, *_ENDS]


@dataclass
class Attempt:
    number: int
    claimed_at: object
    claimed_by: str  # the actor of the claim (agent:<id>); the admin shows it
    holder: str = ""  # the agent process the claim named (host:pid); the admin only, never the API
    ended_at: object = None
    outcome: str | None = None
    message: str = ""


def _outcome(kind: str, detail: dict) -> str:
    if kind == JobEvent.STATUS_REPORTED:
        if detail.get("superseded_claim"):
            return "superseded"
        if detail.get("retry") and detail.get("requeued"):
            return "retrying"
        return str(detail.get("status", ""))
    return _ENDS[kind]


def _message(kind: str, detail: dict) -> str:
    if kind == JobEvent.TIMED_OUT:
        return ("max_runtime_seconds passed." if detail.get("clock") == "max_runtime"
                else "expires_at passed.")
    if kind in _MESSAGES:
        return _MESSAGES[kind]
    return str(detail.get("message") or detail.get("reason") or "")


def _stored(job: Job) -> list[JobEvent]:
    return list(JobEvent.objects.filter(job_id=job.id, kind__in=KINDS).order_by(*TIME_ORDER)
                .only("id", "kind", "attempt", "claim_id", "created_at", "detail", "actor",
                      "holder"))


def attempts(job: Job) -> list[Attempt]:
    """The job's attempts, oldest first (the last MAX_ATTEMPTS_SHOWN). The stored events are
    read first, then what the job row says (timeline.merged drops one stored meanwhile)."""
    stored = _stored(job)
    return _attempts(stored, said(job))


def events_and_attempts(job: Job, limit: int) -> tuple[list[JobEvent], list[Attempt]]:
    """timeline.events(job, limit) and attempts(job), reading what the job row says once,
    after both reads of the stored events (the job's page: GET jobs/{id})."""
    events, stored = stored_events(job, limit), _stored(job)
    derived = said(job)
    return merged(events, derived)[-limit:], _attempts(stored, derived)


def _attempts(stored: list[JobEvent], derived: list[JobEvent]) -> list[Attempt]:
    out: list[Attempt] = []
    live: dict = {}
    early: dict = {}  # endings met before their claim (the same time: SQLite's milliseconds)
    for e in merged(stored, derived):
        if e.kind == JobEvent.CLAIMED:
            attempt = Attempt(e.attempt, e.created_at, e.actor, holder=e.holder or "")
            out.append(attempt)
            if e.claim_id in early:
                _close(attempt, early.pop(e.claim_id))
            else:
                live[e.claim_id] = attempt
            continue
        if e.claim_id is None:  # it did not end a claim (a cancel of a queued job)
            continue
        attempt = live.pop(e.claim_id, None)
        if attempt is None:
            early[e.claim_id] = e
        else:
            _close(attempt, e)
    return out[-MAX_ATTEMPTS_SHOWN:]


def _close(attempt: Attempt, ending: JobEvent) -> None:
    detail = ending.detail or {}
    attempt.ended_at, attempt.outcome = ending.created_at, _outcome(ending.kind, detail)
    attempt.message = _message(ending.kind, detail)
