"""The reaper's batches, which enforce the three clocks (docs/clocks.md):

- claims whose lease expired go back to the queue, or end the job as `expired` on its last
  attempt; a claim whose deadline passed (the lease is capped at it) is ended the same way
  for max_runtime_seconds (event timed_out), and ends the job `expired` whatever its
  attempt for expires_at;
- pending or queued jobs past their expires_at end `expired` (event deadline_passed).

The sweep around them, and its record, are jobqueue.maintenance.reaper."""

from __future__ import annotations

from django.db import transaction
from django.db.models import F, Q
from django.db.models.functions import Now

from jobqueue import observe, states, wakeups
from jobqueue.actors import REAPER
from jobqueue.models import Job, JobClaim, JobEvent

from .finished import announce_finished
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
            .annotate(db_now=Now())
            .only("job_id", "claim_id", "attempt", "deadline_at", "job__attempt",
                  "job__max_attempts", "job__expires_at", "job__workspace_id",
                  "job__job_agent_id", "job__label_set_id", "job__labels")
        )
        # Each claim renewed between the two queries: a race with heartbeats no test can time.
        if not expired_claims:  # pragma: no cover -- that race
            return ReapResult(batches=1)
        JobClaim.objects.filter(job_id__in=[c.job_id for c in expired_claims]).delete()
        ended = {c.job_id: _why(c) for c in expired_claims}
        expiring = {job_id: message for job_id, (_kind, _clock, message) in ended.items()
                    if message}
        to_requeue = [job_id for job_id in ended if job_id not in expiring]
        requeued = expired = 0
        if to_requeue:
            requeued = Job.objects.filter(id__in=to_requeue, status=states.IN_PROGRESS).update(
                status=states.QUEUED, available_at=Now(), updated_at=Now()
            )
        for message in set(expiring.values()):
            expired += Job.objects.filter(
                id__in=[j for j, m in expiring.items() if m == message],
                status=states.IN_PROGRESS,
            ).update(status=states.EXPIRED, completed_at=Now(), updated_at=Now(),
                     message=message)
        if requeued != len(to_requeue) or expired != len(expiring):  # pragma: no cover -- locked
            raise RuntimeError("reaper: job rows changed under their locks")
        events = []
        for c in expired_claims:
            kind, clock, _message = ended[c.job_id]
            detail = {} if clock is None else {"clock": clock,
                                                "requeued": c.job_id not in expiring}
            events.append(event(c.job_id, kind, attempt=c.attempt, actor=actor,
                                claim_id=c.claim_id, **detail))
        JobEvent.objects.bulk_create(events)
        announce_finished(((c.job_id, c.job.workspace_id, states.EXPIRED) for c in expired_claims
                           if c.job_id in expiring), actor=actor)
        wakeups.announce_many(  # requeued: a waiting agent; expired: a waiting producer
            wakeups.job_key(c.job_id) if c.job_id in expiring
            else wakeups.route_key(c.job)
            for c in expired_claims
        )
    observe.emit("reaped", requeued=requeued, expired=expired)
    return ReapResult(requeued=requeued, expired=expired, batches=1)


LEASE_LOST_LAST = "Lease expired on the last attempt."
RUNTIME_LAST = "max_runtime_seconds passed on the last attempt."
EXPIRES_AT_RUNNING = "expires_at passed while the job was running."
EXPIRES_AT_WAITING = "expires_at passed before the job ran."


def _why(claim) -> tuple[str, str | None, str]:
    """Why the reaper ends this claim: (event kind, clock or None for the lease, the
    message of an expired job or "" when the job goes back to the queue)."""
    job, now = claim.job, claim.db_now
    if job.expires_at is not None and job.expires_at <= now:
        return JobEvent.TIMED_OUT, "expires_at", EXPIRES_AT_RUNNING
    last = job.attempt >= job.max_attempts
    if claim.deadline_at is not None and claim.deadline_at <= now:
        return JobEvent.TIMED_OUT, "max_runtime", RUNTIME_LAST if last else ""
    return (JobEvent.EXPIRED, None, LEASE_LOST_LAST) if last else (JobEvent.REAPED, None, "")


def expire_overdue_jobs_once(batch_size: int, *, actor: str = REAPER) -> ReapResult:
    """One bounded batch: pending or queued jobs past their expires_at end `expired`.

    Job rows are taken with SKIP LOCKED (a claim in flight wins: it re-checks expires_at in
    its own WHERE and never claims an overdue job); the update repeats the guards."""
    with transaction.atomic():
        rows = list(
            Job.objects.overdue()
            .order_by()
            .select_for_update(skip_locked=True, of=("self",))
            .values_list("id", "workspace_id", "attempt")[:batch_size]
        )
        workspaces = {job_id: workspace_id for job_id, workspace_id, _attempt in rows}
        attempts = {job_id: attempt for job_id, _workspace_id, attempt in rows}
        if not workspaces:
            return ReapResult()
        job_ids = list(workspaces)
        n = Job.objects.overdue().filter(id__in=job_ids).update(
            status=states.EXPIRED, completed_at=Now(), updated_at=Now(),
            message=EXPIRES_AT_WAITING,
        )
        if n != len(job_ids):  # pragma: no cover - impossible while the locks are held
            raise RuntimeError("reaper: job rows changed under their locks")
        JobEvent.objects.bulk_create(
            event(job_id, JobEvent.DEADLINE_PASSED, attempt=attempts[job_id], actor=actor,
                  clock="expires_at")
            for job_id in job_ids
        )
        announce_finished(((job_id, workspaces[job_id], states.EXPIRED) for job_id in job_ids),
                          actor=actor)
    observe.emit("reaped", requeued=0, expired=n)
    return ReapResult(expired=n, batches=1)


def count_expired_claims() -> dict:
    """What a sweep would do now, without doing it (for --dry-run and the admin)."""
    qs = JobClaim.objects.expired()
    total = qs.count()
    last = qs.filter(Q(job__attempt__gte=F("job__max_attempts")) | Q(job__expires_at__lte=Now())
                     ).count()
    overdue = Job.objects.overdue().count()
    return {"would_requeue": total - last, "would_expire": last + overdue}
