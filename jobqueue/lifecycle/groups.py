"""Groups of jobs (a run's jobs): joining one, its state, and cancelling it as a whole.

A group's row (JobGroup) is written when its first job is created and marked once when it is
cancelled. The row orders the cancel against everything that could add a live job to the
group: a create into it and a requeue of one of its jobs first hold the row FOR SHARE
(`hold_group`, in their own transaction) and refuse with GroupCancelled when it is marked; the
cancel marks it with an UPDATE, which waits for those transactions and makes every later one
see the mark. Once the mark has committed, the group's live jobs can only shrink: the cancel
then ends them in bounded transactions (`GROUP_CANCEL_BATCH` jobs each), taking job rows with
SKIP LOCKED so that it never waits on, nor blocks, a claim, a heartbeat or a report in flight.
Rows it skipped are taken again until none is left, the last of them by waiting for their
(short) transactions. Each job is cancelled as `cancel_job` would: its claim is superseded
(the holder's next write gets 409 job_cancelled) and a `cancelled` event names it.

A queued job of the group may still be claimed while the cancel is under way (the claim
paths do not read the mark: they stay one statement); the cancel then supersedes that claim
before it answers. When `cancel_group` returns, no job of the group is live and none can
become live again.
"""

from __future__ import annotations

import uuid

from django.db import connection, transaction
from django.db.models import Count
from django.db.models.functions import Coalesce, Now

from jobqueue import observe, states
from jobqueue.conf import jobqueue_settings
from jobqueue.exceptions import GroupCancelled, NotFound
from jobqueue.models import Job, JobClaim, JobEvent, JobGroup

from .finished import announce_finished
from .records import event
from .results import GroupState

_HOLD_PG = (
    "SELECT cancelled_at FROM job_group WHERE workspace_id = %s AND name = %s FOR SHARE"
)


def hold_group(workspace_id: uuid.UUID, name: str, *, create: bool) -> None:
    """Inside the caller's transaction: hold the group's row until it commits (creating the
    row first when `create`), or raise GroupCancelled when the group is cancelled."""
    if create:
        JobGroup.objects.bulk_create(
            [JobGroup(workspace_id=workspace_id, name=name)], ignore_conflicts=True
        )
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(_HOLD_PG, [workspace_id, name])
            row = cursor.fetchone()
        cancelled = row is not None and row[0] is not None
    else:  # SQLite: writers are serialized (BEGIN IMMEDIATE); a read is enough
        cancelled = JobGroup.objects.filter(
            workspace_id=workspace_id, name=name, cancelled_at__isnull=False
        ).exists()
    if cancelled:
        raise GroupCancelled()


def group_state(workspace_id: uuid.UUID, name: str) -> GroupState:
    """The group's counts by status; NotFound when no job of the workspace ever had it."""
    group = JobGroup.objects.filter(workspace_id=workspace_id, name=name).first()
    if group is None:
        raise NotFound("No such group.")
    rows = (
        Job.objects.filter(workspace_id=workspace_id, group=name)
        .order_by()
        .values_list("status")
        .annotate(n=Count("id"))
    )
    counts = dict.fromkeys(sorted(states.ALL), 0)
    counts.update(dict(rows))
    return GroupState(
        group=name,
        counts=counts,
        finished=not any(counts[s] for s in states.ACTIVE),
        cancelled_at=group.cancelled_at,
    )


def cancel_group(workspace_id: uuid.UUID, name: str, *, actor: str = "",
                 reason: str = "") -> int:
    """Mark the group cancelled, then cancel each of its live jobs (superseding their
    claims). Returns how many jobs this call cancelled; repeating it is harmless (0)."""
    reason = (reason or "")[:500]
    with transaction.atomic():
        marked = JobGroup.objects.filter(workspace_id=workspace_id, name=name).update(
            cancelled_at=Coalesce("cancelled_at", Now()),
        )
        if not marked:
            raise NotFound("No such group.")
        JobGroup.objects.filter(
            workspace_id=workspace_id, name=name, cancelled_by=""
        ).update(cancelled_by=actor[:200], cancel_reason=reason)
    size = jobqueue_settings()["GROUP_CANCEL_BATCH"]
    total = 0
    while True:
        done = _cancel_batch(workspace_id, name, size, actor, reason, skip_locked=True)
        if not done and _live(workspace_id, name).exists():
            # Every live job left is locked by a transaction in flight: wait for those.
            done = _cancel_batch(workspace_id, name, size, actor, reason, skip_locked=False)
        if not done:
            return total
        total += done


def _live(workspace_id, name):
    return Job.objects.filter(workspace_id=workspace_id, group=name, status__in=states.ACTIVE)


def _cancel_batch(workspace_id, name, size, actor, reason, *, skip_locked: bool) -> int:
    with transaction.atomic():
        rows = list(
            _live(workspace_id, name)
            .order_by("id")
            .select_for_update(skip_locked=skip_locked, no_key=True, of=("self",))
            .values_list("id", "attempt")[:size]
        )
        if not rows:
            return 0
        ids = [job_id for job_id, _ in rows]
        # The rows are locked (PostgreSQL) or the database is write-locked (SQLite); the guard
        # still goes in the WHERE of the write.
        n = Job.objects.filter(id__in=ids, status__in=states.ACTIVE).update(
            status=states.CANCELLED, completed_at=Now(), updated_at=Now(), last_claim_id=None
        )
        if n != len(ids):  # pragma: no cover - impossible while the locks are held
            raise GroupCancelled("The group's jobs changed under the cancel; try again.")
        claims = dict(JobClaim.objects.filter(job_id__in=ids).values_list("job_id", "claim_id"))
        if claims:
            JobClaim.objects.filter(job_id__in=list(claims)).delete()
        JobEvent.objects.bulk_create([
            event(job_id, JobEvent.CANCELLED, attempt=attempt, actor=actor,
                  claim_id=claims.get(job_id), reason=reason,
                  superseded_claim=job_id in claims, group_cancelled=True)
            for job_id, attempt in rows
        ])
        # The outbox rows and job_finished, as every path that ends a job (finished.py).
        announce_finished([(job_id, workspace_id, states.CANCELLED) for job_id, _ in rows],
                          actor=actor)
    for _ in range(n):
        observe.emit("cancelled")
    return n
