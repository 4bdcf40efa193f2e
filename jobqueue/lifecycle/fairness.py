"""Fair shares (docs/api.md, "Fair shares"): where a job with a fairness key takes its place in
claim order, and a workspace's weights by key.

Weighted fair queueing on the claim order itself, so that a claim stays the plain one (no
count, no lock, no extra read): a claim orders by COALESCE(fair_at, available_at)
(jobqueue/claimrule.py, claim_at). A job with `fairness_key` is given, when it is created, the
fair_at after which it would be served if every key with jobs were served in proportion to
its weight: its key's last queued job's fair_at on its route (the queue a claim reads: an
agent's own jobs, a label set's), or, when the key has fallen behind (or has nothing queued
there), the route's virtual time, the fair_at of its first due fair job (the one claims are
taking now; the database's clock when there is none), plus STEP / weight. So a
key with 10,000 jobs queued holds places 1, 2, ... STEPs ahead, a key that arrives after it
starts at the head and interleaves one for one (equal weights), a key of weight 2 takes two
places a STEP, and a key with nothing queued takes none: what it does not use goes to the
others. Priority comes first in claim order, so it outranks fairness. A job without a key
keeps its place by available_at, beside them (STEP of time a place: 10,000 jobs of one key
queued at once spread over 10 seconds of it).
"""

from __future__ import annotations

import datetime as dt

from django.db import transaction
from django.db.models.functions import Now

from jobqueue import states
from jobqueue.lifecycle.backends import backend
from jobqueue.models import FairnessKey, Job

STEP = dt.timedelta(milliseconds=1)  # a place in the virtual time, at weight 1
# How far behind the clock a new place may be: a job without a key (its place: its
# available_at) waits behind fair jobs created at most this long after it.
MAX_LAG = dt.timedelta(minutes=5)
DEFAULT_WEIGHT = 1


def weight_of(workspace_id, key: str) -> int:
    return FairnessKey.objects.filter(workspace_id=workspace_id, key=key).values_list(
        "weight", flat=True).first() or DEFAULT_WEIGHT


def _route(job: Job) -> dict:
    """The jobs that are claimed from the same queue as `job`: its agent's own, or its label
    set's (claimrule's routing)."""
    if job.label_set_id is None:
        return {"job_agent_id": job.job_agent_id, "label_set__isnull": True}
    return {"label_set_id": job.label_set_id}


def place(job: Job) -> dt.datetime:
    """The fair_at of a new job with a fairness key (in the caller's transaction, before its
    insert): after the latest of its key's last queued job on its route, its route's virtual
    time (the route's first due fair job a claim could take: none held back by a key) and
    MAX_LAG before the clock, by STEP / its key's weight; among the jobs of its priority
    (priority comes first in claim order: each priority is a queue of its own). A route is
    the queue a claim reads (an agent's own jobs, a label set's), so that a queue nobody
    claims from (an agent offline or paused) holds back no other's virtual time. Racing
    creates of one key may take one place (the later created goes second: created_at follows
    it in claim order). A job that waits (created held or on its dependencies, delayed,
    retried later) is placed again when it enters the queue or its available_at moves
    (migration 0031's triggers): no later than its available_at, or its release."""
    fair = Job.objects.filter(status=states.QUEUED, fairness_key__isnull=False,
                              priority=job.priority, **_route(job))
    head = fair.filter(available_at__lte=Now(), concurrency_held__isnull=True,
                       rate_held__isnull=True).order_by("fair_at").values_list(
        "fair_at", flat=True).first()  # job_fair_agent_idx, job_fair_set_idx
    last = fair.filter(fairness_key=job.fairness_key).order_by("-fair_at").values_list(
        "fair_at", flat=True).first()  # job_fair_agent_key_idx, job_fair_set_key_idx
    now = backend().now()
    base = max(x for x in (head if head is not None else now, last, now - MAX_LAG)
               if x is not None)
    return base + STEP / weight_of(job.workspace_id, job.fairness_key)


def _respace(workspace_id, key: str, weight: int) -> None:
    """The key's queued jobs, on each route and priority from its first one's place, spaced
    by its new weight."""
    jobs = list(Job.objects.filter(workspace_id=workspace_id, fairness_key=key,
                                   status=states.QUEUED).order_by("fair_at", "created_at")
                .only("id", "fair_at", "job_agent_id", "label_set_id", "priority"))
    step, placed = STEP / weight, {}
    for job in jobs:
        route = ((job.job_agent_id, None) if job.label_set_id is None
                 else (None, job.label_set_id), job.priority)
        start, n = placed.get(route, (job.fair_at, 0))
        job.fair_at = start + step * n
        placed[route] = (start, n + 1)
    Job.objects.bulk_update(jobs, ["fair_at"], batch_size=1000)


def set_weight(workspace_id, key: str, weight: int) -> FairnessKey:
    """Set the key's weight (created or replaced; the caller validated it): its queued jobs
    are spaced by it from now on. Answers the key as stored."""
    with transaction.atomic():
        row, created = FairnessKey.objects.get_or_create(
            workspace_id=workspace_id, key=key, defaults={"weight": weight})
        if not created:
            FairnessKey.objects.filter(id=row.id).update(weight=weight, updated_at=Now())
        _respace(workspace_id, key, weight)
    return FairnessKey.objects.get(id=row.id)


def get_weight(workspace_id, key: str) -> FairnessKey | None:
    return FairnessKey.objects.filter(workspace_id=workspace_id, key=key).first()


def delete_weight(workspace_id, key: str) -> bool:
    """Remove the key's weight (it weighs 1 again, its queued jobs spaced so). Whether it
    had one."""
    with transaction.atomic():
        deleted = FairnessKey.objects.filter(workspace_id=workspace_id, key=key).delete()[0] > 0
        if deleted:
            _respace(workspace_id, key, DEFAULT_WEIGHT)
    return deleted
