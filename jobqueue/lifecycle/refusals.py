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
from dataclasses import dataclass, replace

from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.db.models.functions import Now

from jobqueue import observe, states
from jobqueue.exceptions import (
    ClaimSuperseded,
    DeadlineExceeded,
    JobCancelled,
    JobFinished,
    LeaseExpired,
    NotFound,
)
from jobqueue.models import JobEvent

from .records import event, seen_jobs

HEARTBEAT, STATUS, RELEASE = "heartbeat", "status", "release"
ERRORS = {cls.code: cls for cls in (NotFound, JobCancelled, JobFinished, LeaseExpired,
                                    ClaimSuperseded, DeadlineExceeded)}


@dataclass(frozen=True)
class JobFacts:
    """What the decision reads about one job and its claim, at one moment."""

    status: str
    attempt: int
    last_claim_id: uuid.UUID | None  # the claim that last held (or finished) the job
    claim_id: uuid.UUID | None  # the live claim's, None without one
    lease_expired: bool  # the live claim's lease has run out, by the database's clock
    completed_at: object = None  # what an accepted retry answers
    message: str | None = None  # the job's content, to tell a retry from a different report
    result: object = None
    external_id: str | None = None
    # This claim's report was a retryable failure (its status_reported event says
    # `retry`: such a report is always stored, never read from the job row,
    # jobqueue/timeline.py): read only for a failure's repeat, which repeats the report only
    # with the same `retry` (docs/clocks.md, "Repeats"); a retryable failure's job is queued
    # again, or failed on its last attempt.
    reported: bool = False
    live_deadline_passed: bool = False  # the live claim's deadline has passed
    # A clock ended the attempt of the claim asked about: its deadline passed while it is
    # live, or the reaper ended it for that (a timed_out event; read on the refusal path
    # only, for a claim that is no longer live).
    deadline_passed: bool = False

    @classmethod
    def from_row(cls, row: dict) -> JobFacts:
        """The facts in a job's `values(*FACT_FIELDS)` row (annotated with the database's
        `db_now`), and its content where the row has CONTENT_FIELDS too."""
        now = row["db_now"]
        expires, deadline = row["claim__claim_expires_at"], row["claim__deadline_at"]
        return cls(
            status=row["status"],
            attempt=row["attempt"],
            last_claim_id=row["last_claim_id"],
            claim_id=row["claim__claim_id"],
            lease_expired=expires is not None and expires <= now,
            completed_at=row["completed_at"],
            message=row.get("message"),
            result=row.get("result"),
            external_id=row.get("external_id"),
            live_deadline_passed=deadline is not None and deadline <= now,
        )


# What JobFacts.from_row reads of a job (and its claim); the content, for a report's retry.
FACT_FIELDS = ("status", "attempt", "last_claim_id", "completed_at", "claim__claim_id",
               "claim__claim_expires_at", "claim__deadline_at", "db_now")
CONTENT_FIELDS = ("message", "result", "external_id")


@dataclass(frozen=True)
class Content:
    """What a terminal report carried: None is "not given" (it keeps the job's value)."""

    message: str | None = None
    result: object = None
    external_id: str | None = None
    retry: bool = False

    def repeats(self, facts: JobFacts) -> bool:
        """Applying this report again would change nothing: each field it gives is the
        job's value. A report with different content is not a retry."""
        return all(given is None or given == kept for given, kept in (
            (self.message, facts.message), (self.result, facts.result),
            (self.external_id, facts.external_id)))


def explain_refusal(facts: JobFacts | None, operation: str, claim_id: uuid.UUID,
                    status: str | None = None, content: Content | None = None) -> str | None:
    """The code for a write with `claim_id` that changed nothing, or None when it repeats
    the job's final report (a retry after a lost answer: it is answered as accepted).

    `facts` is None when the caller cannot see the job; `status` is what a report asked and
    `content` what it carried (same claim and status but other content: job_finished)."""
    if facts is None:
        return NotFound.code
    if facts.deadline_passed:
        return DeadlineExceeded.code
    if operation == STATUS and status in states.TERMINAL and facts.last_claim_id == claim_id:
        # Its own final report again: a retry, unless it carries other content. A retryable
        # failure's repeat finds the job queued again (or failed: it was the last attempt);
        # a failure's repeat with the other `retry` is other content.
        retry = content is not None and content.retry
        requeued = retry and facts.status == states.QUEUED and facts.reported
        if facts.status == status or requeued:
            if (content is not None and status == states.FAILURE
                    and retry != facts.reported):
                return JobFinished.code
            return None if content is None or content.repeats(facts) else JobFinished.code
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
    rows = seen_jobs(workspace_id, job_agent_id).filter(id__in=list(job_ids)).annotate(
        db_now=Now()
    ).values("id", *FACT_FIELDS, *CONTENT_FIELDS)
    return {row["id"]: JobFacts.from_row(row) for row in rows}


def _with_reports(facts, writes) -> dict:
    """The facts of the failure reports among `writes` [(job_id, claim_id)] by the claim
    that last held the job, with whether that claim's report taken was a retryable failure:
    one query, on the refusal path only."""
    q = Q()
    for job_id, claim_id in writes:
        q |= Q(job_id=job_id, claim_id=claim_id)
    taken = set(JobEvent.objects.filter(q, kind=JobEvent.STATUS_REPORTED, detail__retry=True)
                .values_list("job_id", "claim_id"))
    return {job_id: replace(facts[job_id], reported=(job_id, claim_id) in taken)
            for job_id, claim_id in writes}


def _with_deadlines(facts, writes) -> dict:
    """Whether a clock ended the attempt of each claim of `writes` [(job_id, claim_id)]:
    the live claim's deadline passed, or (a claim no longer live) the reaper's timed_out
    event names it; one query, only for claims no longer live."""
    gone = [(job_id, claim_id) for job_id, claim_id in writes
            if facts[job_id].claim_id != claim_id]
    timed_out = set()
    if gone:
        q = Q()
        for job_id, claim_id in gone:
            q |= Q(job_id=job_id, claim_id=claim_id)
        timed_out = set(JobEvent.objects.filter(q, kind=JobEvent.TIMED_OUT)
                        .values_list("job_id", "claim_id"))
    out = {}
    for job_id, claim_id in writes:
        f = facts[job_id]
        passed = ((job_id, claim_id) in timed_out if f.claim_id != claim_id
                  else f.live_deadline_passed)
        if passed:
            out[job_id] = replace(f, deadline_passed=True)
    return out


def refuse(writes: list[tuple], operation: str, *, actor: str = "", workspace_id=None,
           job_agent_id=None):
    """Explain the writes [(job_id, claim_id, status asked or None[, Content])] that changed
    nothing.

    Returns ({job_id: code, or None for an accepted retry}, {job_id: facts}); records
    (record_refusals) and counts every refusal of a job the caller can see."""
    facts = load_facts((w[0] for w in writes), workspace_id=workspace_id,
                       job_agent_id=job_agent_id)
    failures = [(w[0], w[1]) for w in writes
                if len(w) > 3 and w[3] is not None and w[2] == states.FAILURE
                and w[0] in facts and facts[w[0]].last_claim_id == w[1]]
    if failures:
        facts.update(_with_reports(facts, failures))
    facts.update(_with_deadlines(facts, [(w[0], w[1]) for w in writes if w[0] in facts]))
    codes, refused = {}, []
    for job_id, claim_id, status, *content in writes:
        code = codes[job_id] = explain_refusal(facts.get(job_id), operation, claim_id, status,
                                               *content)
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
    # In key order: two callers inserting overlapping refusals wait on each other's unique
    # index entries in the same order, never each on the other's (a deadlock).
    fresh = sorted(key for key in keys if key not in existing)
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
               status: str | None = None, content: Content | None = None,
               **scope) -> JobFacts:
    """The same for one write: raises its error (NotFound, or the Conflict named by the
    code); returns the job's facts when the write is an accepted retry."""
    codes, facts = refuse([(job_id, claim_id, status, content)], operation, **scope)
    code = codes[job_id]
    if code is None:
        return facts[job_id]
    raise ERRORS[code]("No such job.") if code == NotFound.code else ERRORS[code]()
