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
from .timeline import TIME_ORDER, UNREAD, merged, said

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


def attempts(job: Job, derived=UNREAD) -> list[Attempt]:
    """The job's attempts, oldest first (the last MAX_ATTEMPTS_SHOWN); `derived`:
    timeline.said(job) if the caller has it."""
    stored = list(JobEvent.objects.filter(job_id=job.id, kind__in=KINDS).order_by(*TIME_ORDER)
                  .only("id", "kind", "attempt", "claim_id", "created_at", "detail", "actor",
                        "holder"))
    rows = merged(stored, said(job) if derived is UNREAD else derived)
    out: list[Attempt] = []
    live: dict = {}
    for e in rows:
        kind, number, claim_id, at, detail, actor, holder = (
            e.kind, e.attempt, e.claim_id, e.created_at, e.detail, e.actor, e.holder)
        if kind == JobEvent.CLAIMED:
            live[claim_id] = attempt = Attempt(number, at, actor, holder=holder or "")
            out.append(attempt)
            continue
        attempt = live.pop(claim_id, None) if claim_id is not None else None
        if attempt is None:  # it did not end a claim (a cancel of a queued job, a refusal)
            continue
        detail = detail or {}
        attempt.ended_at, attempt.outcome = at, _outcome(kind, detail)
        attempt.message = _message(kind, detail)
    return out[-MAX_ATTEMPTS_SHOWN:]
