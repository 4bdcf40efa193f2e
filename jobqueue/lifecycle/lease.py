"""The lease: heartbeats (one claim, or many of one agent) and the agent's release.

A heartbeat writes only job_claim, in one statement: the lease becomes now + lease_seconds
if the claim is current and its lease has not expired (it never revives an expired lease,
even before the reaper runs). A release gives the job back (in_progress -> queued, whatever
its attempt) and ends its claim.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from django.db import transaction
from django.db.models.functions import Now

from jobqueue import observe, states, wakeups
from jobqueue.actors import agent_actor
from jobqueue.db import NowPlusSeconds, db_now
from jobqueue.exceptions import ClaimSuperseded
from jobqueue.models import Job, JobClaim, JobEvent

from . import inputs
from .backends import backend
from .checkpoints import save_checkpoint
from .clocks import within_deadline
from .records import event, scoped_jobs
from .refusals import HEARTBEAT, RELEASE, refuse, refuse_one
from .results import BatchHeartbeatResult, HeartbeatOutcome, HeartbeatResult


def _actor(job_agent_id) -> str:
    return agent_actor(job_agent_id) if job_agent_id else ""


def heartbeat(job_id: uuid.UUID, claim_id: uuid.UUID, *, job_agent_id: uuid.UUID | None = None,
              workspace_id: uuid.UUID | None = None, checkpoint=None) -> HeartbeatResult:
    """Extend the lease to now() + lease_seconds; refused (nothing written) unless claim_id
    is current and its lease has not expired. With `checkpoint` (any JSON but null), the
    checkpoint is saved in the same transaction, under the same guards (job_checkpoint: the
    job table is never written)."""
    data = inputs.checkpoint(checkpoint)
    if data is None:
        renewed = backend().heartbeat(job_id, claim_id, job_agent_id, workspace_id)
    else:
        renewed = _heartbeat_with_checkpoint(job_id, claim_id, data, job_agent_id, workspace_id)
    if renewed is None:
        refuse_one(job_id, claim_id, HEARTBEAT, actor=_actor(job_agent_id),
                   workspace_id=workspace_id, job_agent_id=job_agent_id)
    expires, now = renewed
    observe.emit("heartbeat", job_agent_id=job_agent_id)
    return HeartbeatResult(job_id=job_id, claim_expires_at=expires, server_time=now)


def _heartbeat_with_checkpoint(job_id, claim_id, data, job_agent_id, workspace_id):
    # The renewal first: its UPDATE (guards: current, unexpired, within its deadline) locks
    # the claim row until the checkpoint is saved beside it in the same transaction; the
    # save needs no guard of its own on the time (the renewal just passed them).
    with transaction.atomic():
        renewed = backend().heartbeat(job_id, claim_id, job_agent_id, workspace_id)
        if renewed is not None and not save_checkpoint(
            job_id, claim_id, data, job_agent_id=job_agent_id,
            workspace_id=workspace_id,
        ):  # pragma: no cover - impossible while the claim row is locked
            raise ClaimSuperseded()
        return renewed


def heartbeat_many(job_agent_id: uuid.UUID, claims: Sequence[inputs.ClaimRef], *,
                   workspace_id: uuid.UUID | None = None) -> BatchHeartbeatResult:
    """Renew many claims of one agent at once: `claims` is [ClaimRef(job_id, claim_id)].

    One statement renews every claim that is current and unexpired (the single heartbeat's
    guards, in the WHERE) and writes only job_claim; it runs in autocommit, so the claim
    locks are held only while it runs, not while the refusals are explained. Each other
    claim is answered with why not: lease_expired, claim_superseded, job_cancelled,
    job_finished or not_found (no such job for this agent). Results keep the order of
    `claims`. A batch that breaks a rule (inputs.heartbeat_batch) changes nothing.
    """
    claims = inputs.heartbeat_batch(claims)
    renewed, server_time = backend().heartbeat_many(claims, job_agent_id, workspace_id)
    refused = [(job_id, claim_id, None) for job_id, claim_id in claims if job_id not in renewed]
    codes = {}
    if refused:
        codes, _facts = refuse(refused, HEARTBEAT, actor=agent_actor(job_agent_id),
                               workspace_id=workspace_id, job_agent_id=job_agent_id)
    if renewed:
        observe.emit("heartbeat", job_agent_id=job_agent_id, count=len(renewed))
    results = [
        HeartbeatOutcome(job_id, True, claim_expires_at=renewed[job_id])
        if job_id in renewed else HeartbeatOutcome(job_id, False, code=codes[job_id])
        for job_id, _claim_id in claims
    ]
    return BatchHeartbeatResult(server_time=server_time or db_now(), results=results)


def release_job(
    job_id: uuid.UUID,
    claim_id: uuid.UUID,
    *,
    reason: str = "",
    retry_after_seconds: int | None = None,
    job_agent_id: uuid.UUID | None = None,
    workspace_id: uuid.UUID | None = None,
) -> Job:
    """Give the job back: in_progress -> queued (whatever its attempt), claim removed."""
    retry_after_seconds = inputs.retry_after_seconds(retry_after_seconds) or 0
    actor = _actor(job_agent_id)
    with transaction.atomic():
        n = (
            scoped_jobs(workspace_id, job_agent_id)
            .filter(within_deadline(), id=job_id, status=states.IN_PROGRESS,
                    last_claim_id=claim_id)
            .update(status=states.QUEUED, available_at=NowPlusSeconds(retry_after_seconds),
                    updated_at=Now())
        )
        if n == 1:
            deleted, _ = JobClaim.objects.filter(job_id=job_id, claim_id=claim_id).delete()
            if deleted != 1:  # pragma: no cover - would break invariant 2 (states.py)
                raise ClaimSuperseded()
            job = Job.objects.get(id=job_id)
            event(job.id, JobEvent.RELEASED, attempt=job.attempt, actor=actor, claim_id=claim_id,
                  reason=(reason or "")[:500], retry_after_seconds=retry_after_seconds).save()
            wakeups.announce(wakeups.route_key(job), delay=retry_after_seconds)
    if n != 1:
        refuse_one(job_id, claim_id, RELEASE, actor=actor, workspace_id=workspace_id,
                   job_agent_id=job_agent_id)
    observe.emit("released", job_agent_id=job.job_agent_id)
    return job
