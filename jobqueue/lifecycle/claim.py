"""Claims: a named job, or the next ones in claim order (SKIP LOCKED), at most once each.

A claim moves the job queued -> in_progress (attempt + 1, a fresh claim_id), writes its
claim row (the lease: now + lease_seconds, by the database's clock) and a `claimed` event.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Callable

from django.db import transaction
from django.db.models.functions import Now

from jobqueue import claimrule, observe, states, wakeups
from jobqueue.actors import agent_actor
from jobqueue.conf import jobqueue_settings
from jobqueue.exceptions import AgentPaused, JobNotClaimable, NotFound
from jobqueue.models import CLAIM_ORDER, Job, JobAgent, JobClaim

from . import dependencies, inputs, ratelimits
from .backends import backend
from .checkpoints import checkpoints_for
from .clocks import attempt_deadline, lease_end
from .pause import is_paused
from .records import fetch_job, scoped_jobs
from .results import ClaimGrant

log = logging.getLogger("jobqueue.lifecycle")


def lease_for(job_agent: JobAgent) -> int:
    """The agent's lease, within the service's bounds."""
    conf = jobqueue_settings()
    lease = job_agent.effective_lease_seconds
    return max(conf["MIN_LEASE_SECONDS"], min(conf["MAX_LEASE_SECONDS"], int(lease)))


def heartbeat_interval_for(lease_seconds: int) -> int:
    return max(1, lease_seconds // max(1, jobqueue_settings()["HEARTBEAT_DIVISOR"]))


def _claim(job_agent: JobAgent, limit: int, job_id: uuid.UUID | None = None, *,
           holder: str | None = None, expected_attempt: int | None = None,
           idempotency_key: str | None = None) -> list[ClaimGrant]:
    holder = inputs.holder(holder)
    expected_attempt = inputs.expected_attempt(expected_attempt)
    key = inputs.idempotency_key(idempotency_key)
    lease = lease_for(job_agent)
    if key is None:
        jobs, now = backend().claim(job_agent, lease, limit, agent_actor(job_agent.id), job_id,
                                    holder=holder, expected_attempt=expected_attempt)
    else:
        with transaction.atomic():
            # Serialize the keyed claims of one agent and key until this commits, so that a
            # retry racing its own first request finds the first's claims.
            backend().lock_claim_key(job_agent.id, key)
            replayed = _replay(job_agent.id, key, limit)
            if replayed:
                return replayed
            jobs, now = backend().claim(job_agent, lease, limit, agent_actor(job_agent.id),
                                        holder=holder, idempotency_key=key)
    if not jobs:
        return []
    observe.emit("claimed", job_agent_id=job_agent.id, count=len(jobs))
    _claimed_rate_limited(jobs)
    return grants(jobs, lease, now)


def _claimed_rate_limited(jobs: list[Job]) -> None:
    """A rate limit key's claims fill its window: settled now (in a transaction of its own),
    the key is announced for when the window opens again if jobs wait for it, so that the
    waiting agents take them then (docs/api.md, "Rate limits"). Nothing for a job without a
    key."""
    keys = {(job.workspace_id, job.rate_limit_key) for job in jobs if job.rate_limit_key}
    if not keys:
        return
    try:
        with transaction.atomic():
            ratelimits.settle_keys(keys)
    except Exception:  # the claim has committed: answer it (the reaper's sweep settles them)
        log.warning("settling rate limit keys after a claim failed", exc_info=True)


def _replay(job_agent_id: uuid.UUID, key: str, limit: int) -> list[ClaimGrant]:
    """The agent's current claims made with this key (a retry after a lost answer)."""
    claims = list(
        JobClaim.objects.filter(job_agent_id=job_agent_id, idempotency_key=key)
        .select_related("job")
        .annotate(db_now=Now())
        .alias(claim_at=claimrule.claim_at("job__"))
        .order_by(*(f if f == "claim_at" else f"-job__{f[1:]}" if f.startswith("-")
                    else f"job__{f}" for f in CLAIM_ORDER))[:limit]
    )
    saved = checkpoints_for(claim.job_id for claim in claims)
    dependencies.load_parents([claim.job for claim in claims])
    return [
        ClaimGrant(
            job=claim.job,
            claim_id=claim.claim_id,
            attempt=claim.attempt,
            lease_seconds=claim.lease_seconds,
            claimed_at=claim.claimed_at,
            claim_expires_at=claim.claim_expires_at,
            heartbeat_interval_seconds=heartbeat_interval_for(claim.lease_seconds),
            server_time=claim.db_now,
            checkpoint=saved.get(claim.job_id),
            parents=dependencies.parents(claim.job),
        )
        for claim in claims
    ]


def grants(jobs: list[Job], lease: int, now: dt.datetime) -> list[ClaimGrant]:
    """What a claim returns for jobs just claimed at the database time `now` (the lease
    capped at the attempt's deadline, as stored)."""
    interval = heartbeat_interval_for(lease)
    dependencies.load_parents(jobs)  # no query unless a job has dependencies
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
            checkpoint=getattr(job, "claim_checkpoint", None),
            parents=dependencies.parents(job),
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
    # Tell "not yours / not there" (404) from "paused" and "not claimable now" (409): a job
    # is this agent's when it is routed to it (its own, or labelled with labels it has).
    if not Job.objects.filter(claimrule.routed_to(job_agent), id=job_id).exists():
        raise NotFound("No such job.")
    if is_paused(job_agent.id):
        raise AgentPaused()
    raise JobNotClaimable()


def claim_next(job_agent: JobAgent, limit: int | None = None,
               wait_seconds: int | None = None, *, gone: Callable[[], bool] | None = None,
               holder: str | None = None, idempotency_key: str | None = None
               ) -> list[ClaimGrant]:
    """The one claim of "the next jobs": up to `limit` of this agent's jobs that the claim
    rule lets it take (None: one, the single form), in the rule's order, SKIP LOCKED; with
    `wait_seconds`, waiting up to that long for one to become claimable (jobqueue.wakeups):
    [] once the wait is over, or when `gone()` says the caller left (then nothing is
    claimed); past this process's cap on held waits it answers at once. With
    `idempotency_key`, a retry by the same agent gets the claims the key made back, as long
    as they are current, instead of new ones. `holder` names the agent process (kept on the
    claim and its event, for operators only). Each value is checked here, by the lifecycle's
    rules (inputs.py), whoever calls."""
    wait = inputs.wait_seconds(wait_seconds)  # first, as before: its error wins
    count = 1 if limit is None else inputs.claim_limit(limit)

    def claim() -> list[ClaimGrant]:
        return _claim(job_agent, count, holder=holder, idempotency_key=idempotency_key)

    if not wait:
        return claim()
    # A labelled job's wake-up reaches the waiting agents it matches (not a paused one: its
    # claim would take nothing, and the wake-up would be lost to a running one).
    route = ((str(job_agent.workspace_id), frozenset(job_agent.labels))
             if job_agent.labels and job_agent.paused_at is None else None)
    return wakeups.wait_until(wakeups.agent_key(job_agent.id), wait, claim, gone=gone,
                              route=route) or []


def claim_next_jobs(job_agent: JobAgent, limit: int = 1, *, holder: str | None = None,
                    idempotency_key: str | None = None) -> list[ClaimGrant]:
    """claim_next(job_agent, limit): a batch (`limit` is required), without waiting."""
    return claim_next(job_agent, inputs.claim_limit(limit), holder=holder,
                      idempotency_key=idempotency_key)


def claim_next_job(job_agent: JobAgent, *, holder: str | None = None,
                   idempotency_key: str | None = None) -> ClaimGrant | None:
    """claim_next(job_agent): the next job, or None."""
    claimed = claim_next(job_agent, holder=holder, idempotency_key=idempotency_key)
    return claimed[0] if claimed else None


def claim_next_waiting(job_agent: JobAgent, limit: int | None, wait_seconds: int | None, *,
                       gone: Callable[[], bool] | None = None, holder: str | None = None,
                       idempotency_key: str | None = None) -> list[ClaimGrant]:
    """claim_next(job_agent, limit, wait_seconds): a claim that may wait."""
    return claim_next(job_agent, limit, wait_seconds, gone=gone, holder=holder,
                      idempotency_key=idempotency_key)


def wait_for_job_end(job_id: uuid.UUID, wait_seconds: int | None, *,
                     workspace_id: uuid.UUID | None = None,
                     gone: Callable[[], bool] | None = None) -> None:
    """Hold a producer's read of a job until the job is terminal or `wait_seconds` have
    passed (jobqueue.wakeups). Raises NotFound for a job out of scope, before waiting."""
    wait = inputs.wait_seconds(wait_seconds)
    fetch_job(job_id, workspace_id=workspace_id)
    if wait:
        # Before the first check: a report that locks the row after this commits sees the
        # mark and sends its NOTIFY; one that locked it first ends the job, which the check
        # then sees (jobqueue/sql/postgresql.sql, job_set_state_if_running).
        Job.objects.filter(id=job_id, watched=False, status__in=states.ACTIVE).update(
            watched=True)
    ended = scoped_jobs(workspace_id).filter(id=job_id, status__in=states.TERMINAL)
    wakeups.wait_until(wakeups.job_key(job_id), wait, ended.exists, gone=gone)
