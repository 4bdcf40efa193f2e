"""Why an agent's write carrying a claim_id changed nothing: one decision for every write.

A heartbeat, a report or a release names its claim; when its statement changed nothing,
`explain_refusal` reads the job as it now is and says why, with the code the agent is told
(409, or 404 for a job the caller cannot see). The single writes, the batch heartbeat and
the batch report all ask it, through `refuse()`, which also records each refusal on the
job's timeline and counts it (observe "refused"). The timeline keeps one
`stale_write_refused` event per job, attempt, operation and code, with a count: refused
writes change no job, claim or lease, and however many arrive they add at most one row per
(attempt, operation, code) to the database.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from django.db import IntegrityError, transaction
from django.db.models import F
from django.db.models.functions import Now

from jobqueue import observe, states
from jobqueue.exceptions import (
    ClaimSuperseded,
    JobCancelled,
    JobFinished,
    LeaseExpired,
    NotFound,
)
from jobqueue.models import JobEvent

from .records import event, scoped_jobs

HEARTBEAT, STATUS, RELEASE = "heartbeat", "status", "release"
ERRORS = {cls.code: cls for cls in (NotFound, JobCancelled, JobFinished, LeaseExpired,
                                    ClaimSuperseded)}


@dataclass(frozen=True)
class JobFacts:
    """What the decision reads about one job and its claim, at one moment."""

    status: str
    attempt: int
    last_claim_id: uuid.UUID | None  # the claim that last held (or finished) the job
    claim_id: uuid.UUID | None  # the live claim's, None without one
    lease_expired: bool  # the live claim's lease has run out, by the database's clock
    completed_at: object = None  # what an accepted retry answers


def explain_refusal(facts: JobFacts | None, operation: str, claim_id: uuid.UUID,
                    status: str | None = None) -> str | None:
    """The code for a write with `claim_id` that changed nothing, or None when it repeats
    the job's final report (a retry after a lost answer: it is answered as accepted).

    `facts` is None when the caller cannot see the job; `status` is what a report asked."""
    if facts is None:
        return NotFound.code
    if (operation == STATUS and status in states.TERMINAL and facts.status == status
            and facts.last_claim_id == claim_id):
        return None
    if facts.status == states.CANCELLED:
        return JobCancelled.code
    if facts.status in states.TERMINAL:
        return JobFinished.code
    if operation == HEARTBEAT and facts.claim_id == claim_id and facts.lease_expired:
        return LeaseExpired.code
    return ClaimSuperseded.code


def load_facts(job_ids: Iterable[uuid.UUID], *, workspace_id=None,
               job_agent_id=None) -> dict[uuid.UUID, JobFacts]:
    """The facts of the jobs the caller can see, in one query."""
    rows = scoped_jobs(workspace_id, job_agent_id).filter(id__in=list(job_ids)).annotate(
        db_now=Now()
    ).values("id", "status", "attempt", "last_claim_id", "completed_at", "claim__claim_id",
             "claim__claim_expires_at", "db_now")
    return {
        row["id"]: JobFacts(
            status=row["status"],
            attempt=row["attempt"],
            last_claim_id=row["last_claim_id"],
            claim_id=row["claim__claim_id"],
            lease_expired=row["claim__claim_expires_at"] is not None
            and row["claim__claim_expires_at"] <= row["db_now"],
            completed_at=row["completed_at"],
        )
        for row in rows
    }


def refuse(writes: list[tuple[uuid.UUID, uuid.UUID, str | None]], operation: str, *,
           actor: str = "", workspace_id=None, job_agent_id=None):
    """Explain the writes [(job_id, claim_id, status asked or None)] that changed nothing.

    Returns ({job_id: code, or None for an accepted retry}, {job_id: facts}); records
    (record_refusals) and counts every refusal of a job the caller can see."""
    facts = load_facts((w[0] for w in writes), workspace_id=workspace_id,
                       job_agent_id=job_agent_id)
    codes, refused = {}, []
    for job_id, claim_id, status in writes:
        code = codes[job_id] = explain_refusal(facts.get(job_id), operation, claim_id, status)
        if code is not None and code != NotFound.code:
            refused.append((job_id, facts[job_id].attempt, claim_id, code))
    if refused:
        record_refusals(refused, operation, actor)
        for *_, code in refused:
            observe.emit("refused", operation=operation, code=code)
    return codes, facts


def record_refusals(refused: list[tuple[uuid.UUID, int, uuid.UUID, str]], operation: str,
                    actor: str) -> None:
    """Put the refusals [(job_id, attempt, claim_id, code)], each of another job, on their
    timelines: one `stale_write_refused` event per job, attempt, operation and code, whose
    `count` grows with every further refusal (and `last_at` tells when the latest was).

    A flood of stale writes (a random claim_id, again and again) adds one row, then only
    counts. Three statements whatever the batch: the events that exist get their count
    raised in one UPDATE, the others are inserted in one; a racing caller that inserted
    one of those first (the unique job_event_refusal_once) makes this one count instead."""
    keys = {(job_id, attempt, f"{operation}:{code}"): (claim_id, code)
            for job_id, attempt, claim_id, code in refused}
    existing = _refusal_events(keys)
    fresh = [key for key in keys if key not in existing]
    if existing:
        JobEvent.objects.filter(id__in=existing.values()).update(
            count=F("count") + 1, last_at=Now()
        )
    if not fresh:
        return
    events = [
        _refusal_event(key, *keys[key], operation=operation, actor=actor) for key in fresh
    ]
    try:
        with transaction.atomic():
            JobEvent.objects.bulk_create(events)
    except IntegrityError:
        # Another caller recorded one of them meanwhile: one at a time, counting on theirs.
        for key, one in zip(fresh, events, strict=True):
            _count_or_insert(key, one)


def _refusal_event(key, claim_id, code, *, operation, actor) -> JobEvent:
    job_id, attempt, refusal = key
    e = event(job_id, JobEvent.STALE_WRITE_REFUSED, attempt=attempt, actor=actor,
              claim_id=claim_id, operation=operation, code=code)
    e.refusal = refusal
    return e


def _refusal_events(keys) -> dict:
    """{key: event id} of the refusal events that already exist for `keys`."""
    rows = JobEvent.objects.filter(
        job_id__in={key[0] for key in keys}, refusal__in={key[2] for key in keys}
    ).values_list("job_id", "attempt", "refusal", "id")
    return {(j, a, r): pk for j, a, r, pk in rows if (j, a, r) in keys}


def _count_or_insert(key, one: JobEvent) -> None:
    try:
        with transaction.atomic():
            one.save(force_insert=True)
    except IntegrityError:  # it exists (job_event_refusal_once): count on it
        job_id, attempt, refusal = key
        JobEvent.objects.filter(job_id=job_id, attempt=attempt, refusal=refusal).update(
            count=F("count") + 1, last_at=Now()
        )


def refuse_one(job_id: uuid.UUID, claim_id: uuid.UUID, operation: str, *,
               status: str | None = None, **scope) -> JobFacts:
    """The same for one write: raises its error (NotFound, or the Conflict named by the
    code); returns the job's facts when the write is an accepted retry."""
    codes, facts = refuse([(job_id, claim_id, status)], operation, **scope)
    code = codes[job_id]
    if code is None:
        return facts[job_id]
    raise ERRORS[code]("No such job.") if code == NotFound.code else ERRORS[code]()
