"""What the transitions answer. Plain frozen values: the HTTP edge renders them."""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass, field

from jobqueue.models import Job


class JobCreated(tuple):
    """create_job's answer: the pair (job, created), so `job, created = create_job(...)`
    reads it, and `deduplicated`: True when a unique_key met a live job with the key (the
    job is that one, unchanged or replaced in place), False when the job was created or is
    an Idempotency-Key replay's."""

    def __new__(cls, job: Job, created: bool, deduplicated: bool = False):
        self = super().__new__(cls, (job, created))
        self.deduplicated = deduplicated
        return self

    @property
    def job(self) -> Job:
        return self[0]

    @property
    def created(self) -> bool:
        return self[1]


@dataclass(frozen=True)
class ClaimGrant:
    """What a successful claim hands to the agent (and only to it)."""

    job: Job
    claim_id: uuid.UUID
    attempt: int
    lease_seconds: int
    claimed_at: dt.datetime
    claim_expires_at: dt.datetime
    heartbeat_interval_seconds: int
    server_time: dt.datetime
    checkpoint: object = None  # what an earlier attempt saved (None: nothing)
    # The job's dependencies, each {job_id, status, result} ([] for a job without any).
    parents: list = field(default_factory=list)


@dataclass(frozen=True)
class HeartbeatResult:
    job_id: uuid.UUID
    claim_expires_at: dt.datetime
    server_time: dt.datetime


@dataclass(frozen=True)
class HeartbeatOutcome:
    """One claim's answer in a batch heartbeat: renewed with its new expiry, or why not."""

    job_id: uuid.UUID
    renewed: bool
    claim_expires_at: dt.datetime | None = None
    code: str | None = None


@dataclass(frozen=True)
class BatchHeartbeatResult:
    server_time: dt.datetime
    results: list[HeartbeatOutcome]


@dataclass(frozen=True)
class ReportOutcome:
    """One report's answer in a batch: accepted (with the job's final status and its
    completed_at), or why not (code)."""

    job_id: uuid.UUID
    accepted: bool
    status: str | None = None
    completed_at: dt.datetime | None = None
    code: str | None = None


@dataclass(frozen=True)
class BatchReportResult:
    results: list[ReportOutcome]


@dataclass(frozen=True)
class ReapResult:
    """One reaper batch: claims whose jobs went back to the queue, and those ended."""

    requeued: int = 0
    expired: int = 0
    batches: int = 0

    @property
    def reaped(self) -> int:
        return self.requeued + self.expired


@dataclass(frozen=True)
class GroupState:
    """A group of jobs: how many of its jobs are in each status."""

    group: str
    counts: dict
    finished: bool
    cancelled_at: dt.datetime | None

    def as_document(self) -> dict:
        """As GET groups/{group} answers it (a group.finished delivery's `group`)."""
        cancelled = self.cancelled_at
        return {"group": self.group, "counts": self.counts, "finished": self.finished,
                "cancelled_at": None if cancelled is None
                else cancelled.isoformat().replace("+00:00", "Z")}


@dataclass(frozen=True)
class ClaimCheck:
    """A claim's state, read without writing (GET jobs/{job_id}/claims/{claim_id})."""

    current: bool
    server_time: dt.datetime
    attempt: int | None = None
    claim_expires_at: dt.datetime | None = None
    lease_state: str | None = None  # "active" or "expired" (current claims only)
    code: str | None = None  # what a write with this claim_id would get (others)
    final_status: str | None = None  # the job's final status, when this claim ended it
