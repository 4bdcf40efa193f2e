"""The portable path: claims and reports as conditional ORM updates (SQLite runs it).

Each transition runs in `transaction.atomic()`; its guards are in the WHERE of the one
update that writes, and the row count says whether it applied. On SQLite every write
transaction is BEGIN IMMEDIATE (config/settings.py), so writers are serialized and the same
conditional updates keep the rules; `select_for_update(skip_locked=True)` is then a no-op.
"""

from __future__ import annotations

import uuid

from django.db import transaction
from django.db.models import Case, F, Q, UUIDField, Value, When
from django.db.models.functions import Now

from jobqueue import claimrule, states
from jobqueue.exceptions import ClaimSuperseded, JobNotClaimable
from jobqueue.models import Job, JobAgent, JobClaim, JobEvent
from jobqueue.timeline import MESSAGE_CHARS, row_says_report, unstored_claimed

from .artifacts import publish
from .checkpoints import checkpoints_for
from .clocks import attempt_deadline, lease_end, retry_fields, within_deadline
from .dependencies import settle_many, settle_one
from .finished import write_outbox
from .records import event, scoped_jobs


def claim_candidates(job_agent, candidates=None):
    """The locking query of a claim: the jobs routed to this agent (its own, and the
    labelled jobs it matches) that the claim rule (jobqueue/claimrule.py) lets it take, in
    its order, SKIP LOCKED, with the database's clock alongside. Served by
    job_claim_order_idx (and job_label_claim_order_idx). The PostgreSQL statements lock the
    same rows (tests/integration/core/test_claim_rule.py)."""
    qs = Job.objects.all() if candidates is None else candidates
    return (
        qs.filter(claimrule.routed_to(job_agent))
        .claimable()
        .in_claim_order()
        .annotate(db_now=Now())
        .select_for_update(skip_locked=True, no_key=True, of=("self",))
    )


class OrmBackend:
    """Claims and reports through the ORM, for a database without a statement of its own
    for them (SQLite's backend is this one plus its heartbeat statements)."""

    def __init__(self, db):
        self.db = db

    def claim(self, job_agent, lease: int, limit: int, actor: str, job_id=None, *,
              holder: str = "", expected_attempt: int | None = None,
              idempotency_key: str | None = None):
        """Lock up to `limit` claimable jobs (or the one named, at `expected_attempt` if
        given) and claim them: (jobs, the database's time)."""
        candidates = None if job_id is None else Job.objects.filter(id=job_id)
        if candidates is not None and expected_attempt is not None:
            candidates = candidates.filter(attempt=expected_attempt)
        with transaction.atomic():
            locked = list(claim_candidates(job_agent, candidates)[:limit])
            if not locked:
                return [], None
            # The rule's agent conditions (not paused): else hand out nothing. SQLite holds
            # the write lock here (BEGIN IMMEDIATE), so a pause cannot commit between this
            # read and the claim below.
            if not JobAgent.objects.filter(claimrule.agent_may_claim(), id=job_agent.id).exists():
                return [], None
            now = locked[0].db_now
            self._claim_locked(job_agent, locked, lease, now, actor, holder, idempotency_key)
            saved = checkpoints_for(job.id for job in locked)
        for job in locked:
            job.claim_checkpoint = saved.get(job.id)
        return locked, now

    @staticmethod
    def _claim_locked(job_agent, locked, lease, now, actor, holder="", idempotency_key=None):
        claim_ids = {job.id: uuid.uuid4() for job in locked}
        # The rows are locked (PostgreSQL) or the database is write-locked (SQLite), so these
        # values are current; the guard still goes in the WHERE of the one write for the batch.
        last_claim_id = (
            Value(claim_ids[locked[0].id])
            if len(locked) == 1
            else Case(
                *(When(id=job_id, then=Value(cid)) for job_id, cid in claim_ids.items()),
                output_field=UUIDField(),
            )
        )
        # The event rows of the claims these replace (the job row said them until now;
        # jobqueue/timeline.py, claimed_event), from the values read under the lock.
        events = unstored_claimed(locked)
        n = Job.objects.filter(id__in=list(claim_ids), status=states.QUEUED).update(
            status=states.IN_PROGRESS,
            attempt=F("attempt") + 1,
            last_claim_id=last_claim_id,
            started_at=now,
            updated_at=now,
            claim_lease_seconds=lease,
            claim_holder=holder or None,
            job_agent_id=job_agent.id,  # a labelled job's claimer (its own job's agent)
        )
        if n != len(locked):  # pragma: no cover - impossible while the locks are held
            raise JobNotClaimable()
        claims = []
        for job in locked:
            job.status = states.IN_PROGRESS
            job.attempt += 1
            job.last_claim_id = claim_ids[job.id]
            job.started_at = job.updated_at = now
            job.claim_lease_seconds, job.claim_holder = lease, holder or None
            job.job_agent_id = job_agent.id
            deadline = attempt_deadline(job, now)
            claims.append(JobClaim(
                job_id=job.id, job_agent_id=job_agent.id, claim_id=job.last_claim_id,
                attempt=job.attempt, lease_seconds=lease, claimed_at=now,
                claim_expires_at=lease_end(now, lease, deadline), deadline_at=deadline,
                holder=holder, idempotency_key=idempotency_key,
            ))
        JobClaim.objects.bulk_create(claims)
        if events:
            JobEvent.objects.bulk_create(events)

    def report(self, job_id, claim_id, status, actor, *, message, result, external_id,
               job_agent_id, workspace_id, retry=False):
        """The job after a report that its claim allowed, or None (nothing changed)."""
        fields = {"updated_at": Now()}
        for name, value in (("message", message), ("result", result),
                            ("external_id", external_id)):
            if value is not None:
                fields[name] = value
        guard = Q(id=job_id, status=states.IN_PROGRESS, last_claim_id=claim_id) & within_deadline()
        with transaction.atomic():
            qs = scoped_jobs(workspace_id, job_agent_id).filter(guard)
            if status == states.IN_PROGRESS:
                n = qs.update(**fields)
                kind = JobEvent.PROGRESS_REPORTED
            else:
                ending = retry_fields() if retry else {"status": status, "completed_at": Now()}
                n = qs.update(**ending, **fields)
                if n == 1:
                    # The job row is ours (locked); its claim row goes with it.
                    deleted, _ = JobClaim.objects.filter(job_id=job_id, claim_id=claim_id).delete()
                    if deleted != 1:  # pragma: no cover - would break invariant 2 (states.py)
                        raise ClaimSuperseded()
                    if status == states.SUCCESSFUL:
                        publish(job_id, claim_id)  # the claim's staged artifacts
                kind = JobEvent.STATUS_REPORTED
            if n != 1:
                return None
            job = Job.objects.get(id=job_id)
            extra = {"retry": True, "requeued": job.status == states.QUEUED} if retry else {}
            if message and kind == JobEvent.STATUS_REPORTED:
                extra["message"] = message[:MESSAGE_CHARS]
            if not (kind == JobEvent.STATUS_REPORTED and not retry
                    and row_says_report(job, actor, message, result)):
                event(job.id, kind, attempt=job.attempt, actor=actor, claim_id=claim_id,
                      status=status, has_result=result is not None, **extra).save()
            if job.status in states.TERMINAL:
                write_outbox([(job.id, job.workspace_id, job.status)])
                if job.has_dependents:
                    settle_one(job.id, job.status)
            return job

    def settle_dependents(self, ended) -> None:
        """Settle the dependents of the jobs `ended` [(job_id, status)] that have any, in
        the caller's transaction (lifecycle/dependencies.py)."""
        settle_many(ended)

    def report_many(self, items, job_agent_id, workspace_id, actor):
        """{job_id: (status, completed_at)} of the reports that their claims allowed, all in
        one transaction."""
        done = {}
        with transaction.atomic():
            for r in items:
                job = self.report(r.job_id, r.claim_id, r.status, actor, message=r.message,
                                  result=r.result, external_id=r.external_id,
                                  job_agent_id=job_agent_id, workspace_id=workspace_id,
                                  retry=r.retry)
                if job is not None:
                    done[job.id] = (job.status, job.completed_at, job.workspace_id)
        return done
