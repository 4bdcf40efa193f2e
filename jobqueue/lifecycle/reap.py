"""The reaper's batch: claims whose lease expired go back to the queue, or end the job as
`expired` on its last attempt. The loop around it, and its record, are jobqueue.reaper."""

from __future__ import annotations

from django.db import transaction
from django.db.models import F
from django.db.models.functions import Now

from jobqueue import observe, states, wakeups
from jobqueue.actors import REAPER
from jobqueue.models import Job, JobClaim, JobEvent

from .records import event
from .results import ReapResult


def reap_expired_claims_once(batch_size: int, *, actor: str = REAPER) -> ReapResult:
    """One bounded batch: expired claims -> queued, or expired on the last attempt.

    Job rows are taken with SKIP LOCKED (a job whose report is in flight is left for the
    next sweep, and reapers running at once split the work); the claim rows are then
    locked and re-checked for expiry, so a heartbeat that got there first wins.
    """
    with transaction.atomic():
        job_ids = list(
            Job.objects.lease_expired()
            .order_by()
            .select_for_update(skip_locked=True, of=("self",))
            .values_list("id", flat=True)[:batch_size]
        )
        if not job_ids:
            return ReapResult()
        expired_claims = list(
            JobClaim.objects.filter(job_id__in=job_ids)
            .expired()
            .order_by("job_id")  # claim rows in job_id order, as heartbeat_many locks them
            .select_for_update(of=("self",))
            .select_related("job")
            .only("job_id", "claim_id", "attempt", "job__attempt", "job__max_attempts",
                  "job__job_agent_id")
        )
        if not expired_claims:
            return ReapResult(batches=1)
        JobClaim.objects.filter(job_id__in=[c.job_id for c in expired_claims]).delete()
        expiring = {c.job_id for c in expired_claims if c.job.attempt >= c.job.max_attempts}
        to_requeue = [c.job_id for c in expired_claims if c.job_id not in expiring]
        requeued = expired = 0
        if to_requeue:
            requeued = Job.objects.filter(id__in=to_requeue, status=states.IN_PROGRESS).update(
                status=states.QUEUED, available_at=Now(), updated_at=Now()
            )
        if expiring:
            expired = Job.objects.filter(id__in=list(expiring), status=states.IN_PROGRESS).update(
                status=states.EXPIRED,
                completed_at=Now(),
                updated_at=Now(),
                message="Lease expired on the last attempt.",
            )
        if requeued != len(to_requeue) or expired != len(expiring):  # pragma: no cover
            raise RuntimeError("reaper: job rows changed under their locks")
        JobEvent.objects.bulk_create(
            event(c.job_id, JobEvent.EXPIRED if c.job_id in expiring else JobEvent.REAPED,
                  attempt=c.attempt, actor=actor, claim_id=c.claim_id)
            for c in expired_claims
        )
        wakeups.announce_many(  # requeued: a waiting agent; expired: a waiting producer
            wakeups.job_key(c.job_id) if c.job_id in expiring
            else wakeups.agent_key(c.job.job_agent_id)
            for c in expired_claims
        )
    observe.emit("reaped", requeued=requeued, expired=expired)
    return ReapResult(requeued=requeued, expired=expired, batches=1)


def count_expired_claims() -> dict:
    """What a sweep would do now, without doing it (for --dry-run and the admin)."""
    qs = JobClaim.objects.expired()
    total = qs.count()
    last = qs.filter(job__attempt__gte=F("job__max_attempts")).count()
    return {"would_requeue": total - last, "would_expire": last}
