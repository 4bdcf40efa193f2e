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

Finishing (the `group.finished` webhook event): `mark_finished_groups`, run by maintenance
(the group watcher), takes live groups (finished_at null) FOR NO KEY UPDATE SKIP LOCKED, and
in a later statement (a fresh snapshot, READ COMMITTED) marks those with no pending, queued or
in-progress job finished, writing their outbox rows in the same transaction. The hot paths
(claim, heartbeat, report) never read or write a group. Only a create and a requeue can make a
group live again, and both hold its row first; so while the watcher holds a group's row no job
can join or revive in it, and a mark it commits is true. A create or requeue that finds its
group marked finished raises GroupFinished: its caller rolls its transaction back (releasing
the shared lock, so two of them never wait for each other's) and runs it again with
`reopen=True`, whose first statement sets finished_at back to null under a row lock; the group
then finishes, and says so, again.
"""

from __future__ import annotations

import uuid

from django.db import transaction
from django.db.models import Count, Exists, OuterRef
from django.db.models.functions import Coalesce, Now

from jobqueue import observe, states
from jobqueue.conf import jobqueue_settings
from jobqueue.db import db_now
from jobqueue.exceptions import GroupCancelled, NotFound
from jobqueue.models import Job, JobClaim, JobEvent, JobGroup
from jobqueue.timeline import keep_claimed_many

from .backends import backend
from .finished import announce_finished, write_group_outbox
from .records import event
from .results import GroupState


class GroupFinished(Exception):
    """hold_group found the group marked finished: roll the transaction back and run it again
    with reopen=True (see the module's doc)."""


def hold_group(workspace_id: uuid.UUID, name: str, *, create: bool,
               reopen: bool = False) -> None:
    """Inside the caller's transaction, as its first write: hold the group's row until it
    commits (creating the row first when `create`); GroupCancelled when the group is
    cancelled, GroupFinished when it is marked finished and not `reopen`."""
    if reopen:  # under the row lock this takes: no watcher can mark it again meanwhile
        JobGroup.objects.filter(workspace_id=workspace_id, name=name,
                                finished_at__isnull=False,
                                cancelled_at__isnull=True).update(finished_at=None)
    if create:
        JobGroup.objects.bulk_create(
            [JobGroup(workspace_id=workspace_id, name=name)], ignore_conflicts=True
        )
    row = backend().hold_group(workspace_id, name)
    if row is not None and row[0] is not None:
        raise GroupCancelled()
    if row is not None and row[1] is not None:
        raise GroupFinished()


def holding_group(run):
    """Call run(reopen) (its transaction starts with hold_group(..., reopen=reopen)) until it
    does not raise GroupFinished: first without reopening, then reopening."""
    reopen = False
    while True:
        try:
            return run(reopen)
        except GroupFinished:
            reopen = True


def _counts(rows) -> dict:
    counts = dict.fromkeys(sorted(states.ALL), 0)
    counts.update(dict(rows))
    return counts


def mark_finished_groups(batch_size: int) -> list[GroupState]:
    """Mark every live group that has no live job left finished, `batch_size` groups per
    transaction, each with its group.finished outbox rows; return the groups it marked."""
    marked: list[GroupState] = []
    after = 0
    while True:
        with transaction.atomic():
            ids = list(
                JobGroup.objects.filter(finished_at__isnull=True, id__gt=after)
                .order_by("id")
                .select_for_update(skip_locked=True, no_key=True)
                .values_list("id", flat=True)[:batch_size]
            )
            if not ids:
                return marked
            after = ids[-1]
            # A later statement: it sees every create and requeue that committed before the
            # rows were locked, and none can be in flight now.
            live = Job.objects.filter(workspace_id=OuterRef("workspace_id"),
                                      group=OuterRef("name"), status__in=states.ACTIVE)
            groups = list(JobGroup.objects.filter(id__in=ids).filter(~Exists(live)).order_by("id"))
            if groups:
                now = db_now()
                JobGroup.objects.filter(id__in=[g.id for g in groups]).update(finished_at=now)
                finished = _finished_states(groups)
                write_group_outbox([(g, finished[g.id]) for g in groups], now)
                marked.extend(finished.values())


def _finished_states(groups: list[JobGroup]) -> dict[int, GroupState]:
    """Each group's counts by status (one query), as its group.finished delivery tells it."""
    by_key: dict[tuple, list] = {(g.workspace_id, g.name): [] for g in groups}
    rows = (
        Job.objects.filter(workspace_id__in={g.workspace_id for g in groups},
                           group__in={g.name for g in groups})
        .order_by()
        .values_list("workspace_id", "group", "status")
        .annotate(n=Count("id"))
    )
    for workspace_id, name, status, n in rows:
        if (workspace_id, name) in by_key:
            by_key[(workspace_id, name)].append((status, n))
    return {
        g.id: GroupState(group=g.name, counts=_counts(by_key[(g.workspace_id, g.name)]),
                         finished=True, cancelled_at=g.cancelled_at)
        for g in groups
    }


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
    counts = _counts(rows)
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
            .only("id", "attempt", "job_agent_id", "last_claim_id", "started_at",
                  "claim_lease_seconds", "claim_holder")[:size]
        )
        if not rows:
            return 0
        ids = [job.id for job in rows]
        # The latest claims' `claimed`, read from the rows until this clears last_claim_id
        # (jobqueue/timeline.py).
        keep_claimed_many(rows)
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
            event(job.id, JobEvent.CANCELLED, attempt=job.attempt, actor=actor,
                  claim_id=claims.get(job.id), reason=reason,
                  superseded_claim=job.id in claims, group_cancelled=True)
            for job in rows
        ])
        # The outbox rows and job_finished, as every path that ends a job (finished.py).
        announce_finished([(job_id, workspace_id, states.CANCELLED) for job_id in ids],
                          actor=actor)
    for _ in range(n):
        observe.emit("cancelled")
    return n
