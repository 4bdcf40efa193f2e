"""Job logs: each attempt's log, appended by its claim's holder as GitLab's runner sends its
trace (a chunk names its start; repeated bytes are accepted unchanged, a gap is refused with
the log's length), and read from an offset while the attempt runs.

Who may append: the current claim (even after its lease's expiry, until the reaper takes
it, as for a report), or a claim that ended less than LOG_GRACE_SECONDS ago by the
database's clock (cancelled, reaped, released, requeued, reported), so its last lines are
kept. A log never publishes anything: results and artifacts still need the current claim.

Storage: one `job_log` row per attempt holds the length; each accepted append is one
`job_log_chunk` row [offset, end). The log row is locked (FOR UPDATE) for the append, so
appends to one attempt's log are serialized and the length check and the write agree.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from django.db import transaction
from django.db.models import Exists, Q
from django.db.models.functions import Now

from jobqueue.actors import agent_actor
from jobqueue.conf import jobqueue_settings
from jobqueue.db import NowPlusSeconds
from jobqueue.exceptions import LogRangeGap, NotFound, OutputTooLarge
from jobqueue.models import Job, JobClaim, JobEvent, JobLog, JobLogChunk
from jobqueue.redaction import redact_text
from jobqueue.timeline import derived_report

from .records import fetch_job
from .refusals import refuse_one

LOG = "log"
# The events that end a claim: its holder may still append for the grace period after one
# (or after the agent's final report, read from the job row).
CLAIM_ENDINGS = (JobEvent.CANCELLED, JobEvent.REQUEUED, JobEvent.REAPED, JobEvent.EXPIRED,
                 JobEvent.RELEASED, JobEvent.STATUS_REPORTED)


@dataclass(frozen=True)
class LogState:
    attempt: int
    length: int


@dataclass(frozen=True)
class LogSlice:
    attempt: int
    length: int  # the whole log's, now
    offset: int
    data: bytes

    def redacted_text(self, secrets: list[str]) -> str:
        """The slice as an operator sees it (the admin's log tails): decoded, without the
        dispatch_context's secrets (jobqueue.redaction). A slice that starts inside the log
        may start inside a secret (`cut`) and begins with "…"."""
        text = redact_text(self.data.decode("utf-8", errors="replace"), secrets,
                           cut=bool(self.offset))
        return ("…" if self.offset else "") + text


def _scoped(qs, prefix, workspace_id, job_agent_id):
    if workspace_id is not None:
        qs = qs.filter(**{f"{prefix}workspace_id": workspace_id})
    if job_agent_id is not None:
        qs = qs.filter(**{f"{prefix}job_agent_id": job_agent_id})
    return qs


def log_attempt(job_id: uuid.UUID, claim_id: uuid.UUID, *, workspace_id=None,
                job_agent_id=None) -> int:
    """The attempt whose log `claim_id` may append to now, or raise the refusal."""
    attempt = (
        _scoped(JobClaim.objects.filter(job_id=job_id, claim_id=claim_id), "job__",
                workspace_id, job_agent_id)
        .values_list("attempt", flat=True).first()
    )
    if attempt is not None:
        return attempt
    grace = jobqueue_settings()["LOG_GRACE_SECONDS"]
    ended = _scoped(JobEvent.objects.filter(job_id=job_id, claim_id=claim_id,
                                            kind__in=CLAIM_ENDINGS,
                                            created_at__gt=NowPlusSeconds(-grace)),
                    "job__", workspace_id, None)
    if job_agent_id is not None:
        # The claim's holder: the job's agent, or, for a labelled job another agent has
        # claimed since, the agent whose `claimed` event names the claim (stored by the next
        # claim: jobqueue/timeline.py).
        ended = ended.filter(Q(job__job_agent_id=job_agent_id) | Exists(JobEvent.objects.filter(
            job_id=job_id, claim_id=claim_id, kind=JobEvent.CLAIMED,
            actor=agent_actor(job_agent_id))))
    attempt = ended.values_list("attempt", flat=True).first()
    if attempt is not None:
        return attempt
    # Its end may be the agent's final report, read from the job row (jobqueue/timeline.py).
    job = (_scoped(Job.objects.filter(id=job_id, last_claim_id=claim_id,
                                      completed_at__gt=NowPlusSeconds(-grace)),
                   "", workspace_id, job_agent_id).first())
    if job is not None and derived_report(job) is not None:
        return job.attempt
    refuse_one(job_id, claim_id, LOG, workspace_id=workspace_id, job_agent_id=job_agent_id)
    raise NotFound("No such job.")  # pragma: no cover - refuse_one raises for a log write


def append_log(job_id: uuid.UUID, claim_id: uuid.UUID, data: bytes, *, start: int | None = None,
               workspace_id=None, job_agent_id=None) -> LogState:
    """Append `data` at byte `start` (None: at the end) of the claim's attempt's log.

    Bytes before the log's end repeat what is stored and are skipped (a resent chunk is
    accepted unchanged); a start past the end raises LogRangeGap(length); a log that would
    pass MAX_LOG_BYTES raises OutputTooLarge and keeps nothing of the chunk."""
    cap = jobqueue_settings()["MAX_LOG_BYTES"]
    # Checked before the append's transaction, so that a refusal's event is kept. A claim
    # that ends between the check and the append is within its grace period.
    attempt = log_attempt(job_id, claim_id, workspace_id=workspace_id, job_agent_id=job_agent_id)
    with transaction.atomic():
        JobLog.objects.get_or_create(job_id=job_id, attempt=attempt)
        log = JobLog.objects.select_for_update().get(job_id=job_id, attempt=attempt)
        length = log.length
        if start is None:
            start = length
        if start > length:
            raise LogRangeGap(length=length)
        new = data[length - start:]
        if not new:
            return LogState(attempt, length)
        if length + len(new) > cap:
            raise OutputTooLarge(f"A log holds at most {cap} bytes.", length=length)
        JobLogChunk.objects.create(log=log, offset=length, end=length + len(new), data=new)
        n = JobLog.objects.filter(pk=log.pk, length=length).update(
            length=length + len(new), updated_at=Now())
        if n != 1:  # pragma: no cover - the row is locked
            raise RuntimeError("log: the length changed under its lock")
        return LogState(attempt, length + len(new))


def read_log(job_id: uuid.UUID, *, attempt: int | None = None, offset: int = 0,
             limit: int | None = None, workspace_id=None, job_agent_id=None) -> LogSlice:
    """The log of `attempt` (None: the latest attempt with a log, else the job's current
    attempt) from byte `offset`, at most `limit` bytes."""
    job = fetch_job(job_id, workspace_id=workspace_id, job_agent_id=job_agent_id)
    logs = JobLog.objects.filter(job_id=job.id)
    log = (logs.filter(attempt=attempt) if attempt is not None
           else logs.order_by("-attempt")).first()
    if log is None:
        return LogSlice(attempt if attempt is not None else job.attempt, 0, offset, b"")
    stop = log.length if limit is None else min(log.length, offset + limit)
    if offset >= stop:
        return LogSlice(log.attempt, log.length, offset, b"")
    chunks = (JobLogChunk.objects.filter(log=log, end__gt=offset, offset__lt=stop)
              .order_by("offset").values_list("offset", "data"))
    parts = []
    for chunk_offset, data in chunks:
        data = bytes(data)
        parts.append(data[max(0, offset - chunk_offset):stop - chunk_offset])
    return LogSlice(log.attempt, log.length, offset, b"".join(parts))


def log_tails(job_id: uuid.UUID, tail_bytes: int) -> list[LogSlice]:
    """The last `tail_bytes` of each attempt's log, latest attempt first (the admin shows
    each one's `redacted_text`)."""
    return [read_log(job_id, attempt=log.attempt, offset=max(0, log.length - tail_bytes))
            for log in JobLog.objects.filter(job_id=job_id).order_by("-attempt")]
