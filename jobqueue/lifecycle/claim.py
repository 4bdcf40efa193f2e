"""Claims: a named job, or the next ones in claim order (SKIP LOCKED), at most once each.

A claim moves the job queued -> in_progress (attempt + 1, a fresh claim_id), writes its
claim row (the lease: now + lease_seconds, by the database's clock) and a `claimed` event.
"""

from __future__ import annotations

import datetime as dt
import uuid

from jobqueue import observe
from jobqueue.actors import agent_actor
from jobqueue.conf import jobqueue_settings
from jobqueue.exceptions import JobNotClaimable
from jobqueue.models import Job, JobAgent

from . import inputs
from .backends import backend
from .records import fetch_job
from .results import ClaimGrant


def lease_for(job_agent: JobAgent) -> int:
    """The agent's lease, within the service's bounds."""
    conf = jobqueue_settings()
    lease = job_agent.effective_lease_seconds
    return max(conf["MIN_LEASE_SECONDS"], min(conf["MAX_LEASE_SECONDS"], int(lease)))


def heartbeat_interval_for(lease_seconds: int) -> int:
    return max(1, lease_seconds // max(1, jobqueue_settings()["HEARTBEAT_DIVISOR"]))


def _claim(job_agent: JobAgent, limit: int, job_id: uuid.UUID | None = None, *,
           holder: str | None = None, expected_attempt: int | None = None) -> list[ClaimGrant]:
    holder = inputs.holder(holder)
    expected_attempt = inputs.expected_attempt(expected_attempt)
    lease = lease_for(job_agent)
    jobs, now = backend().claim(job_agent, lease, limit, agent_actor(job_agent.id), job_id,
                                holder=holder, expected_attempt=expected_attempt)
    if not jobs:
        return []
    observe.emit("claimed", job_agent_id=job_agent.id, count=len(jobs))
    return grants(jobs, lease, now)


def grants(jobs: list[Job], lease: int, now: dt.datetime) -> list[ClaimGrant]:
    """What a claim returns for jobs just claimed at the database time `now`."""
    expires = now + dt.timedelta(seconds=lease)
    interval = heartbeat_interval_for(lease)
    return [
        ClaimGrant(
            job=job,
            claim_id=job.last_claim_id,
            attempt=job.attempt,
            lease_seconds=lease,
            claimed_at=now,
            claim_expires_at=expires,
            heartbeat_interval_seconds=interval,
            server_time=now,
        )
        for job in jobs
    ]


def claim_job(job_agent: JobAgent, job_id: uuid.UUID, *, holder: str | None = None,
              expected_attempt: int | None = None) -> ClaimGrant:
    """Claim the named job for this agent: at most once, whoever races for it; with
    `expected_attempt`, only while the job's attempt still equals it. `holder` names the
    agent process (kept on the claim and its event, for operators only)."""
    claimed = _claim(job_agent, 1, job_id, holder=holder, expected_attempt=expected_attempt)
    if claimed:
        return claimed[0]
    # Tell "not yours / not there" (404) from "not claimable now" (409).
    fetch_job(job_id, job_agent_id=job_agent.id)
    raise JobNotClaimable()


def claim_next_jobs(job_agent: JobAgent, limit: int = 1, *,
                    holder: str | None = None) -> list[ClaimGrant]:
    """Claim up to `limit` of this agent's claimable jobs, in claim order (SKIP LOCKED)."""
    return _claim(job_agent, inputs.claim_limit(limit), holder=holder)


def claim_next_job(job_agent: JobAgent, *, holder: str | None = None) -> ClaimGrant | None:
    claimed = _claim(job_agent, 1, holder=holder)
    return claimed[0] if claimed else None
