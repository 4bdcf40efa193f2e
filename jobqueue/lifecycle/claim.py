"""Claims: a named job, or the next ones in claim order (SKIP LOCKED), at most once each.

A claim moves the job queued -> in_progress (attempt + 1, a fresh claim_id), writes its
claim row (the lease: now + lease_seconds, by the database's clock) and a `claimed` event.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable

from jobqueue import observe, states, wakeups
from jobqueue.actors import agent_actor
from jobqueue.conf import jobqueue_settings
from jobqueue.exceptions import AgentPaused, JobNotClaimable
from jobqueue.models import Job, JobAgent

from . import inputs
from .backends import backend
from .orm import attempt_deadline, lease_end
from .pause import is_paused
from .records import fetch_job, scoped_jobs
from .results import ClaimGrant


def lease_for(job_agent: JobAgent) -> int:
    """The agent's lease, within the service's bounds."""
    conf = jobqueue_settings()
    lease = job_agent.effective_lease_seconds
    return max(conf["MIN_LEASE_SECONDS"], min(conf["MAX_LEASE_SECONDS"], int(lease)))


def heartbeat_interval_for(lease_seconds: int) -> int:
    return max(1, lease_seconds // max(1, jobqueue_settings()["HEARTBEAT_DIVISOR"]))


def _claim(job_agent: JobAgent, limit: int, job_id: uuid.UUID | None = None) -> list[ClaimGrant]:
    lease = lease_for(job_agent)
    jobs, now = backend().claim(job_agent, lease, limit, agent_actor(job_agent.id), job_id)
    if not jobs:
        return []
    observe.emit("claimed", job_agent_id=job_agent.id, count=len(jobs))
    return grants(jobs, lease, now)


def grants(jobs: list[Job], lease: int, now: dt.datetime) -> list[ClaimGrant]:
    """What a claim returns for jobs just claimed at the database time `now` (the lease
    capped at the attempt's deadline, as stored)."""
    interval = heartbeat_interval_for(lease)
    return [
        ClaimGrant(
            job=job,
            claim_id=job.last_claim_id,
            attempt=job.attempt,
            lease_seconds=lease,
            claimed_at=now,
            claim_expires_at=lease_end(now, lease, attempt_deadline(job, now)),
            heartbeat_interval_seconds=interval,
            server_time=now,
        )
        for job in jobs
    ]


def claim_job(job_agent: JobAgent, job_id: uuid.UUID) -> ClaimGrant:
    """Claim the named job for this agent: at most once, whoever races for it."""
    claimed = _claim(job_agent, 1, job_id)
    if claimed:
        return claimed[0]
    # Tell "not yours / not there" (404) from "paused" and "not claimable now" (409).
    fetch_job(job_id, job_agent_id=job_agent.id)
    if is_paused(job_agent.id):
        raise AgentPaused()
    raise JobNotClaimable()


def claim_next_jobs(job_agent: JobAgent, limit: int = 1) -> list[ClaimGrant]:
    """Claim up to `limit` of this agent's claimable jobs, in claim order (SKIP LOCKED)."""
    return _claim(job_agent, inputs.claim_limit(limit))


def claim_next_job(job_agent: JobAgent) -> ClaimGrant | None:
    claimed = _claim(job_agent, 1)
    return claimed[0] if claimed else None


def claim_next_waiting(job_agent: JobAgent, limit: int | None, wait_seconds: int | None, *,
                       gone: Callable[[], bool] | None = None) -> list[ClaimGrant]:
    """Claim the next job (limit None) or up to `limit`, waiting up to `wait_seconds` for
    one to become claimable for this agent (jobqueue.wakeups): the claims, or [] once the
    wait is over, or when `gone()` says the caller left (then nothing is claimed).
    Past this process's cap on held waits it answers at once."""
    wait = inputs.wait_seconds(wait_seconds)
    count = 1 if limit is None else inputs.claim_limit(limit)
    claimed = wakeups.wait_until(wakeups.agent_key(job_agent.id), wait,
                                 lambda: _claim(job_agent, count), gone=gone)
    return claimed or []


def wait_for_job_end(job_id: uuid.UUID, wait_seconds: int | None, *,
                     workspace_id: uuid.UUID | None = None,
                     gone: Callable[[], bool] | None = None) -> None:
    """Hold a producer's read of a job until the job is terminal or `wait_seconds` have
    passed (jobqueue.wakeups). Raises NotFound for a job out of scope, before waiting."""
    wait = inputs.wait_seconds(wait_seconds)
    fetch_job(job_id, workspace_id=workspace_id)
    ended = scoped_jobs(workspace_id).filter(id=job_id, status__in=states.TERMINAL)
    wakeups.wait_until(wakeups.job_key(job_id), wait, ended.exists, gone=gone)
