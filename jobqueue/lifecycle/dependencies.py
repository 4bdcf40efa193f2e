"""Dependencies between jobs (POST jobs depends_on, POST flows; docs/api.md "Dependencies
and flows").

A job created with dependencies (`has_parents`) waits `pending` until every parent is
`successful`, then becomes `queued` in the transaction that made the last one successful; if
a parent ends `failure`, `cancelled` or `expired`, it ends `cancelled` (message
"dependency_failed: <parent id>") and so do its own dependents, in that same transaction. A
retryable failure that queues the parent again settles nothing. Nothing revives a cancelled
dependent (a later requeue of the parent finds it terminal).

Who pays: a job that some job depends on carries `has_dependents` (set by hold_parents under
its row's lock when the dependent is created). Only the transitions that end such a job run
the settling: PostgreSQL's report statements in their own statement (they return the column
anyway), every other path through `settle` (one more statement per batch of ended jobs, from
announce_finished). A plain job's claim and report run nothing more.

On PostgreSQL the settling is one function, jobqueue_settle_dependents (migration 0021), for
every path (the backend's settle_dependents runs it by name); on SQLite (writers serialized)
the ORM below does the same.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from django.db.models import F
from django.db.models.functions import Greatest, Now

from jobqueue import states, wakeups
from jobqueue.exceptions import InvalidInput
from jobqueue.models import Job, JobDependency, JobEvent

from .backends import backend
from .finished import write_outbox
from .records import event

DEPENDENCY_FAILED = "dependency_failed"
FAILED = frozenset({states.FAILURE, states.CANCELLED, states.EXPIRED})


def failed_message(parent_id) -> str:
    return f"{DEPENDENCY_FAILED}: {parent_id}"


def hold_parents(workspace_id, ids: Iterable[uuid.UUID], field: str) -> dict:
    """Inside the create's transaction: lock the parents (in id order, as the batches lock
    job rows), mark them has_dependents, and answer {parent id: status} as they are now
    (after any transition that held them committed: it then sees the mark, and settles the
    new dependent). An id that is not a job of the workspace, another workspace's included,
    is InvalidInput naming `field` (nothing is written: the caller's transaction rolls
    back)."""
    ids = sorted(set(ids))
    rows = dict(
        Job.objects.filter(workspace_id=workspace_id, id__in=ids).order_by("id")
        .select_for_update(no_key=True).values_list("id", "status")
    )
    if len(rows) != len(ids):
        raise InvalidInput("Each dependency must be a job of this workspace.", field=field)
    Job.objects.filter(id__in=ids, has_dependents=False).update(has_dependents=True)
    return rows


def initial_state(statuses: dict) -> tuple[str, str]:
    """(status, message) of a new job whose parents are now `statuses`: cancelled naming a
    parent that ended otherwise than successful, queued when all succeeded, else pending."""
    for parent_id, status in sorted(statuses.items()):
        if status in FAILED:
            return states.CANCELLED, failed_message(parent_id)
    if all(status == states.SUCCESSFUL for status in statuses.values()):
        return states.QUEUED, ""
    return states.PENDING, ""


def settle(ended) -> None:
    """In the transaction that ended them: settle the dependents of the jobs `ended`
    [(job_id, workspace_id, terminal status)], not empty, that have any (the backend's
    settle_dependents)."""
    backend().settle_dependents([(job_id, status) for job_id, _ws, status in ended])


def settle_many(ended) -> None:
    """The ORM's settle_dependents: settle_one for each of `ended` [(job_id, status)] that
    has dependents."""
    having = set(Job.objects.filter(id__in=[job_id for job_id, _ in ended],
                                    has_dependents=True).values_list("id", flat=True))
    for job_id, status in sorted(ended):
        if job_id in having:
            settle_one(job_id, status)


def settle_one(parent_id, status: str) -> int:
    """The ORM's settling of a job that ended with the terminal `status` (SQLite: writers
    are serialized, so what it reads stays true until it commits): as
    jobqueue_settle_dependents on PostgreSQL. The number of jobs it moved."""
    if status == states.SUCCESSFUL:
        return _release(parent_id)
    return _cascade(parent_id)


def _release(parent_id) -> int:
    children = list(Job.objects.filter(
        id__in=JobDependency.objects.filter(parent_id=parent_id).values("child_id"),
        status=states.PENDING).only("id", "job_agent_id", "attempt", "workspace_id",
                                    "label_set_id", "labels"))
    released = []
    for child in children:
        child_id, attempt = child.id, child.attempt
        waiting = (JobDependency.objects.filter(child_id=child_id).exclude(parent_id=parent_id)
                   .exclude(parent__status=states.SUCCESSFUL).exists())
        if not waiting:
            released.append((child_id, child, attempt))
    if not released:
        return 0
    Job.objects.filter(id__in=[r[0] for r in released], status=states.PENDING).update(
        status=states.QUEUED, available_at=Greatest(F("available_at"), Now()),
        updated_at=Now())
    JobEvent.objects.bulk_create([
        event(child_id, JobEvent.DISPATCHED, attempt=attempt, dependencies="successful",
              parent=str(parent_id))
        for child_id, _child, attempt in released])
    wakeups.announce_many(sorted({wakeups.route_key(child) for _c, child, _a in released}))
    return len(released)


def _cascade(parent_id) -> int:
    frontier = [parent_id]
    total = 0
    while frontier:
        edges = {}
        for child_id, parent in (JobDependency.objects.filter(parent_id__in=frontier)
                                 .order_by("child_id", "parent_id")
                                 .values_list("child_id", "parent_id")):
            edges.setdefault(child_id, parent)
        pending = list(Job.objects.filter(id__in=list(edges), status=states.PENDING)
                       .values_list("id", "workspace_id", "attempt"))
        for child_id, _ws, _attempt in pending:
            Job.objects.filter(id=child_id, status=states.PENDING).update(
                status=states.CANCELLED, completed_at=Now(), updated_at=Now(),
                message=failed_message(edges[child_id]))
        JobEvent.objects.bulk_create([
            event(child_id, JobEvent.CANCELLED, attempt=attempt, reason=DEPENDENCY_FAILED,
                  parent=str(edges[child_id]))
            for child_id, _ws, attempt in pending])
        write_outbox([(child_id, ws, states.CANCELLED) for child_id, ws, _a in pending])
        wakeups.announce_many(wakeups.job_key(child_id) for child_id, _ws, _a in pending)
        total += len(pending)
        frontier = [child_id for child_id, _ws, _a in pending]
    return total


def parents_of(job_ids) -> dict:
    """{child id: [{job_id, status, result}, ...]} for the jobs `job_ids` (one query; a job
    without dependencies is left out), parents in id order."""
    parents: dict = {}
    rows = (JobDependency.objects.filter(child_id__in=list(job_ids))
            .order_by("child_id", "parent_id")
            .values_list("child_id", "parent_id", "parent__status", "parent__result"))
    for child_id, parent_id, status, result in rows:
        parents.setdefault(child_id, []).append(
            {"job_id": parent_id, "status": status, "result": result})
    return parents


def load_parents(jobs) -> None:
    """Set `parents` on each of `jobs` that has_parents (one query for all, none when no job
    has any): what the claim answer and the job's representation read."""
    having = [job for job in jobs if job.has_parents]
    if not having:
        return
    found = parents_of(job.id for job in having)
    for job in having:
        job.parents = found.get(job.id, [])


def parents(job) -> list:
    """The job's parents as load_parents leaves them ([] for a job without dependencies)."""
    if not job.has_parents:
        return []
    if not hasattr(job, "parents"):
        load_parents([job])
    return job.parents


def waiting_on(job) -> list:
    """The ids of the job's parents not yet successful, while it waits for them (pending)."""
    if job.status != states.PENDING:
        return []
    return [p["job_id"] for p in parents(job) if p["status"] != states.SUCCESSFUL]
