"""A job's timeline: its stored events (job_event) and the one event read from the job row.

An agent's final report (`status_reported` of a successful, failure or cancelled report
without `retry`, by the job's own agent) is not written as an event row when the job row
already says all of it: the report's UPDATE leaves the job with that status, `completed_at`
(the event's time: the same statement's), `attempt`, `last_claim_id` (the event's claim),
`message` and `result`. So the report writes nothing to job_event, its indexes and the
foreign-key lock they take on the job (#26: about a sixth of a job's WAL), and every reader
of the timeline reads the event from the row instead (`derived_report`). The report writes
the event row after all when the row cannot say it exactly (jobqueue/sql/postgresql.sql,
job_set_state_if_running; lifecycle/orm.py): a report by another actor (a workspace key on
the agent's path), or one that leaves the job a `message` or a `result` it did not carry
(an earlier progress report's or attempt's, kept by COALESCE).

The row says it only while it is the job's last word: a job whose `last_claim_id` is that
claim and that no stored event ended (ENDINGS with that claim_id: a cancel, a reap, a
release, a clock, an operator's mark-failed or requeue all write theirs). The one transition
that moves such a job on, an operator's requeue of the finished job (it clears
`last_claim_id`), first writes the event row (`keep_report`, under the job's row lock).

What it does not do: a reader runs its queries (the job, its stored events, whether a stored
event ended the last claim) as separate statements, so a requeue committed between them can
leave the report out of that one answer (never twice: the stored events are read first). A
kept report gets the id of its writing, so an id-ordered page shows it after any refused
write recorded between the report and the requeue. The admin's timeline pages by event id
and places the report by its time, assuming times rise with ids (events a transaction
writes carry its start time; a page boundary between two such can show the report twice).
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


def derived_report(job: Job) -> JobEvent | None:
    """The job's final report read from its row (unsaved), or None when the row does not
    hold one: the job is not finished, no claim finished it, or a stored event ended that
    claim. One indexed query, only for a finished job."""
    if job.status not in states.TERMINAL or job.last_claim_id is None:
        return None
    ended = JobEvent.objects.filter(job_id=job.id, claim_id=job.last_claim_id,
                                    kind__in=ENDINGS).exists()
    return None if ended else report_event(job)


# "Not read yet": a caller that shows both the events and the attempts reads the derived
# report once (derived_report) and hands it to both.
UNREAD = object()


def events(job: Job, limit: int, report=UNREAD) -> list[JobEvent]:
    """The job's newest `limit` events, oldest first, the derived report among them
    (`report`: derived_report(job) if the caller has it)."""
    stored = list(job.events.order_by("-id")[:limit])[::-1]
    return merged(stored, derived_report(job) if report is UNREAD else report)[-limit:]


def merged(stored: list[JobEvent], derived: JobEvent | None) -> list[JobEvent]:
    """`stored` (oldest first) with `derived` placed by its time: after every stored event
    of the same time or earlier (it is its statement's last word)."""
    if derived is None:
        return stored
    at = next((i for i, e in enumerate(stored) if e.created_at > derived.created_at),
              len(stored))
    return [*stored[:at], derived, *stored[at:]]


def keep_report(job_id) -> None:
    """Write the job's derived report as an event row, before a transition clears what it
    is read from. The caller holds the job's row lock (select_for_update) inside its
    transaction, so two such transitions never both write it."""
    # FOR NO KEY UPDATE, as the requeue's own UPDATE takes: FOR UPDATE would also block the
    # KEY SHARE lock a foreign-key check takes at commit (an effect's begin inserting its
    # row while holding the claim row the requeue waits for: a deadlock).
    job = Job.objects.select_for_update(no_key=True).filter(id=job_id).first()
    if job is not None:
        event = derived_report(job)
        if event is not None:
            event.save()
