"""A job's timeline: its stored events (job_event) and the events read from the job row.

Two events are not written as rows when the job row says all of them (#26: each about a
sixth of a job's WAL, with its indexes and the foreign-key lock it takes on the job):

- *The latest claim's `claimed`.* The claim writes the job's `last_claim_id` (the event's
  claim), `attempt`, `started_at` (the event's time: the same statement's), and the lease and
  holder it asked for (`claim_lease_seconds`, `claim_holder`); the actor is the job's agent,
  the only one that claims it (`claimed_event`). The row says it until the next claim
  replaces those values: that claim writes the replaced claim's event row first, from the
  values it read under the row lock (jobqueue/sql/postgresql.sql, the `kept` CTE; lifecycle/
  orm.py), and so does an operator's transition that clears `last_claim_id` (`keep_said`).
  A job claimed before migration 0022 has `claim_lease_seconds` NULL: its event is stored.
- *An agent's final report* (`status_reported` of a successful, failure or cancelled report
  without `retry`, by the job's own agent): the report's UPDATE leaves the job with that
  status, `completed_at` (the event's time), `attempt`, `last_claim_id`, `message` and
  `result`. The report writes the event row after all when the row cannot say it exactly
  (jobqueue/sql/postgresql.sql, job_set_state_if_running; lifecycle/orm.py): a report by
  another actor (a workspace key on the agent's path), or one that leaves the job a `message`
  or a `result` it did not carry (an earlier progress report's or attempt's, kept by
  COALESCE). The row says it only while it is the job's last word: no stored event ended
  that claim (ENDINGS with its claim_id: a cancel, a reap, a release, a clock, an operator's
  mark-failed or requeue all write theirs).

Every reader (the API's `events` and `attempts`, the admin's timeline and attempts, a log's
grace period, the Recovery page's charts) reads them with `said`: one indexed query, the
stored events of the job's last claim. Events are in time order (`created_at`, then id): an
event row written later than its time (a replaced claim's, a kept report) has a later id.

What it does not do: a reader runs its queries (the job, its stored events, the last claim's
stored events) as separate statements, so a claim or a requeue committed between them can
leave an event out of that one answer. Never twice: the stored events are read first, and
`merged` drops a derived event that they hold after all. The admin's timeline pages by event
id and places each derived or late-written event by its time, on the page whose ids it falls
among; an event written late can show on a newer page. Two events of one time (SQLite keeps
milliseconds) keep the order they were written in, or for a derived one come after the
stored: the attempts (history.py) close a claim whichever of the two comes first.
"""

from __future__ import annotations

from jobqueue import states
from jobqueue.actors import agent_actor
from jobqueue.models import Job, JobEvent

MESSAGE_CHARS = 200  # what a status_reported event keeps of the report's message

# The events that end a claim (each names it in claim_id).
ENDINGS = (JobEvent.STATUS_REPORTED, JobEvent.RELEASED, JobEvent.REAPED, JobEvent.EXPIRED,
           JobEvent.TIMED_OUT, JobEvent.CANCELLED, JobEvent.REQUEUED)


def row_says_report(job: Job, actor: str, message: str | None, result) -> bool:
    """Whether the job row, just ended by a terminal report without retry, says all its
    event would: the job's own agent made it, and the job's message and result are the
    report's (given, or none kept from before). The PostgreSQL statements say the same in
    SQL (job_set_state_if_running, job_set_state_if_running_many)."""
    return (actor == agent_actor(job.job_agent_id)
            and (message is not None or job.message == "")
            and (result is not None or job.result is None))


def report_event(job: Job) -> JobEvent:
    """The `status_reported` event the job row says (unsaved): what the report statement
    would have written."""
    detail: dict = {"status": job.status, "has_result": job.result is not None}
    if job.message:
        detail["message"] = job.message[:MESSAGE_CHARS]
    return JobEvent(job_id=job.id, kind=JobEvent.STATUS_REPORTED, attempt=job.attempt,
                    actor=agent_actor(job.job_agent_id), claim_id=job.last_claim_id,
                    detail=detail, created_at=job.completed_at, holder="", count=1)


def claimed_event(job: Job) -> JobEvent:
    """The `claimed` event of the job's latest claim, as its row says it (unsaved): what the
    claim statement would have written."""
    return JobEvent(job_id=job.id, kind=JobEvent.CLAIMED, attempt=job.attempt,
                    actor=agent_actor(job.job_agent_id), claim_id=job.last_claim_id,
                    detail={"lease_seconds": job.claim_lease_seconds},
                    created_at=job.started_at, holder=job.claim_holder or "", count=1)


def says_claimed(job: Job) -> bool:
    """Whether the row holds its latest claim's values (the event may be stored all the
    same: `said` asks)."""
    return job.last_claim_id is not None and job.claim_lease_seconds is not None


def said(job: Job) -> list[JobEvent]:
    """The events the job row says and no row stores (unsaved, oldest first): its latest
    claim's `claimed`, its agent's final report. At most one indexed query (the stored
    events of the latest claim), none for a job never claimed."""
    if job.last_claim_id is None:
        return []
    finished = job.status in states.TERMINAL
    if not (finished or says_claimed(job)):
        return []
    stored = set(JobEvent.objects.filter(job_id=job.id, claim_id=job.last_claim_id)
                 .order_by().values_list("kind", flat=True).distinct())
    out = []
    if says_claimed(job) and JobEvent.CLAIMED not in stored:
        out.append(claimed_event(job))
    if finished and not stored.intersection(ENDINGS):
        out.append(report_event(job))
    return out


def derived_report(job: Job) -> JobEvent | None:
    """The job's final report read from its row (unsaved), or None when the row does not
    hold one: the job is not finished, no claim finished it, or a stored event ended that
    claim."""
    return next((e for e in said(job) if e.kind == JobEvent.STATUS_REPORTED), None)


TIME_ORDER = ("created_at", "id")


# The fields `said` reads: a caller whose job was loaded without one of them (a deferred
# field loads on its own, later: a claim committed between the two reads mixes two claims)
# reloads them in one query (`fresh`).
SAID_FIELDS = ("id", "status", "job_agent_id", "attempt", "last_claim_id", "started_at",
               "completed_at", "message", "result", "claim_lease_seconds", "claim_holder")


def fresh(job_id) -> Job | None:
    """The job's fields `said` reads, in one query."""
    return Job.objects.only(*SAID_FIELDS).filter(id=job_id).first()


def stored_events(job: Job, limit: int) -> list[JobEvent]:
    """The job's newest `limit` stored events, in time order."""
    return list(job.events.order_by("-created_at", "-id")[:limit])[::-1]


def events(job: Job, limit: int) -> list[JobEvent]:
    """The job's newest `limit` events in time order, those the row says among them. The
    stored events are read first: an event stored after that (a claim storing the one it
    replaces) is then still said by the row, or `merged` finds it stored; never twice."""
    stored = stored_events(job, limit)
    return merged(stored, said(job))[-limit:]


def _stored_already(event: JobEvent, stored: list[JobEvent]) -> bool:
    """Whether `stored` holds the derived `event` after all (a claim or a requeue committed
    between the reader's queries stored it)."""
    if event.kind == JobEvent.CLAIMED:
        return any(e.kind == JobEvent.CLAIMED and e.claim_id == event.claim_id for e in stored)
    return any(e.kind in ENDINGS and e.claim_id == event.claim_id for e in stored)


def merged(stored: list[JobEvent], derived: list[JobEvent]) -> list[JobEvent]:
    """`stored` (in time order) with each of `derived` (in time order) that it does not hold
    placed by its time: after every stored event of the same time or earlier (each is its
    statement's last word)."""
    out = list(stored)
    for event in derived:
        if _stored_already(event, stored):
            continue
        # Before the first stored event of a later time: after a derived one placed before
        # it too (a claim, then its report: their times never fall the other way).
        at = next((i for i, e in enumerate(out)
                   if e.pk is not None and e.created_at > event.created_at), len(out))
        out.insert(at, event)
    return out


def keep_said(jobs) -> None:
    """Write the events the job row says as event rows, before a transition clears what
    they are read from. `jobs`: the one job the transition may change (its id, its scope and
    the transition's condition), so that nothing is locked or written for a job it will not
    change. The caller is in a transaction; this takes the job's row lock, so two such
    transitions never both write them."""
    # FOR NO KEY UPDATE, as the transitions' own UPDATE takes: FOR UPDATE would also block
    # the KEY SHARE lock a foreign-key check takes at commit (an effect's begin inserting its
    # row while holding the claim row the requeue waits for: a deadlock).
    job = jobs.select_for_update(no_key=True).only(*SAID_FIELDS).first()
    if job is not None:
        events = said(job)
        if events:
            JobEvent.objects.bulk_create(events)


def unstored_claimed(jobs: list[Job]) -> list[JobEvent]:
    """The latest claims' `claimed` events (unsaved) that the rows of `jobs` say and no row
    stores: what a transaction that replaces or clears those claims stores first. `jobs` are
    locked by the caller and read with the fields `said` reads. One query, only when a row
    says a claim (a job's first claim sends none)."""
    said_by = [job for job in jobs if says_claimed(job)]
    if not said_by:
        return []
    stored = set(JobEvent.objects.filter(kind=JobEvent.CLAIMED,
                                         job_id__in=[job.id for job in said_by],
                                         claim_id__in=[job.last_claim_id for job in said_by])
                 .order_by().values_list("job_id", "claim_id"))
    return [claimed_event(job) for job in said_by if (job.id, job.last_claim_id) not in stored]


def keep_claimed_many(jobs: list[Job]) -> None:
    """Store unstored_claimed(jobs) (a group's cancel, which ends no job by a report the row
    could say, clears their last_claim_id)."""
    events = unstored_claimed(jobs)
    if events:
        JobEvent.objects.bulk_create(events)
