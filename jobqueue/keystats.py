"""Concurrency keys, rate limit keys and fairness keys, key by key: what /metrics
(ops/metrics.py) and the admin's "Concurrency keys", "Rate limits" and "Fair shares" pages
(jobqueue/admin/concurrency.py, jobqueue/admin/ratelimits.py, jobqueue/admin/fairness.py) show
of them, read from the database when asked.

A key belongs to a workspace (docs/api.md, "Concurrency keys"). Of each key: `running`, its
jobs in progress; `held`, its queued jobs its slots keep back (concurrency_held: the triggers
of migration 0027 set and clear it); `waiting`, its queued jobs given a slot that no claim took
yet; `limit`, the largest concurrency_limit among its live jobs (each job has its own; they
agree unless producers disagree). Only the keys with something held back or running are
listed, the most held back first: a bounded number of them (JOBQUEUE_METRICS_TOP_KEYS on
/metrics), so that a workspace with a key per customer does not make a series per customer.
One query: a GROUP BY over the live jobs with a key.

A rate limit key (docs/api.md, "Rate limits") is read from its limit (rate_limit: `count`
claims in `period_seconds`): `claimed`, its jobs claimed in the window (their latest claim,
started_at, in the last period_seconds, on the database's clock: `rate_window`, what explain
reads too); `held`, its queued jobs the window holds back (rate_held: the triggers of
migration 0029 set and clear it); `permitted`, its queued jobs given a permit that no claim
took yet. Only the keys with a limit and something held back or claimed in the window are
listed, the most held back first, a bounded number of them. One query: the limits, each with
three counts read through the job table's partial indexes of migration 0030.

A fairness key (docs/api.md, "Fair shares") holds no job back, it only orders them: of each
key, `queued` and `running` (its jobs queued, in progress) and `weight` (its fairness_key row's,
1 without one). Only the keys with jobs queued or in progress are listed, the most queued
first, a bounded number of them. Two queries: a GROUP BY over the live jobs with a key, and
the listed keys' weights. `queued_weights` sums, per workspace, the weights of the keys with
jobs queued: a key's share of the next claims of fair jobs is its weight over that sum.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import (
    Count,
    Exists,
    F,
    IntegerField,
    Max,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
    Value,
)
from django.db.models.functions import Coalesce

from jobqueue import states
from jobqueue.db import NowPlusSeconds


@dataclass(frozen=True)
class KeyStats:
    workspace_id: object
    key: str
    running: int
    held: int
    waiting: int
    limit: int


def busiest_keys(top: int) -> list[KeyStats]:
    """At most `top` keys with jobs held back or running: the most held back first, then the
    most running, then by workspace and key. A key's limit is 1 when its jobs give none (a
    job written without one: the triggers read it as 1 too)."""
    from jobqueue.models import Job

    if top <= 0:
        return []
    jobs = Job.objects.filter(concurrency_key__isnull=False, status__in=sorted(states.ACTIVE))
    rows = (
        jobs.order_by().values("workspace_id", "concurrency_key")
        .annotate(
            running=Count("id", filter=Q(status=states.IN_PROGRESS)),
            held=Count("id", filter=Q(status=states.QUEUED, concurrency_held=True)),
            waiting=Count("id", filter=Q(status=states.QUEUED, concurrency_held__isnull=True)),
            most=Max("concurrency_limit"),
        )
        .filter(Q(running__gt=0) | Q(held__gt=0))
        .order_by("-held", "-running", "workspace_id", "concurrency_key")[:top]
    )
    return [KeyStats(row["workspace_id"], row["concurrency_key"], row["running"], row["held"],
                     row["waiting"], row["most"] or 1) for row in rows]


@dataclass(frozen=True)
class RateKeyStats:
    workspace_id: object
    key: str
    count: int
    period_seconds: int
    claimed: int
    held: int
    permitted: int


def rate_window() -> QuerySet:
    """The jobs of an outer rate_limit row's key claimed in its window (started_at, the latest
    claim, after now - period_seconds, on the database's clock), for a subquery: the jobs that
    hold the key's permits with those given one and not claimed yet (migration 0029)."""
    from jobqueue.models import Job

    return Job.objects.filter(
        workspace_id=OuterRef("workspace_id"), rate_limit_key=OuterRef("key"),
        started_at__gt=NowPlusSeconds(OuterRef("period_seconds") * -1)).order_by()


def _counted(jobs) -> Coalesce:
    """How many of these jobs (a subquery per outer rate_limit row), 0 for none."""
    return Coalesce(Subquery(jobs.values("rate_limit_key").annotate(n=Count("id")).values("n")),
                    Value(0), output_field=IntegerField())


def with_rate_stats(limits: QuerySet) -> QuerySet:
    """Rate limits (rate_limit rows), each with `claimed`, `held` and `permitted` (a subquery
    each, on the job table's partial indexes)."""
    from jobqueue.models import Job

    queued = Job.objects.filter(workspace_id=OuterRef("workspace_id"),
                                rate_limit_key=OuterRef("key"), status=states.QUEUED).order_by()
    return limits.annotate(
        claimed=_counted(rate_window()),
        held=_counted(queued.filter(rate_held=True)),
        permitted=_counted(queued.filter(rate_held__isnull=True)),
    )


def busiest_rate_keys(top: int) -> list[RateKeyStats]:
    """At most `top` rate limit keys with a limit and jobs held back or claimed in the window:
    the most held back first, then the most claimed, then by workspace and key."""
    from jobqueue.models import RateLimit

    if top <= 0:
        return []
    rows = (
        with_rate_stats(RateLimit.objects.all())
        .filter(Q(held__gt=0) | Q(claimed__gt=0))
        .order_by("-held", "-claimed", "workspace_id", "key")
        .values_list("workspace_id", "key", "count", "period_seconds", "claimed", "held",
                     "permitted")[:top]
    )
    return [RateKeyStats(*row) for row in rows]


@dataclass(frozen=True)
class FairKeyStats:
    workspace_id: object
    key: str
    weight: int
    queued: int
    running: int


def _fair_jobs() -> QuerySet:
    """The jobs of an outer fairness_key row's key, for a subquery."""
    from jobqueue.models import Job

    return Job.objects.filter(workspace_id=OuterRef("workspace_id"),
                              fairness_key=OuterRef("key")).order_by()


def _counted_fair(jobs) -> Coalesce:
    """How many of these jobs (a subquery per outer fairness_key row), 0 for none."""
    return Coalesce(Subquery(jobs.values("fairness_key").annotate(n=Count("id")).values("n")),
                    Value(0), output_field=IntegerField())


def with_fairness_stats(keys: QuerySet) -> QuerySet:
    """Fairness keys (fairness_key rows), each with `queued` and `running`, its jobs queued
    (on the job table's partial index job_fair_key_idx) and in progress (a subquery each)."""
    return keys.annotate(
        queued=_counted_fair(_fair_jobs().filter(status=states.QUEUED)),
        running=_counted_fair(_fair_jobs().filter(status=states.IN_PROGRESS)),
    )


def busiest_fairness_keys(top: int) -> list[FairKeyStats]:
    """At most `top` fairness keys with jobs queued or in progress: the most queued first,
    then the most running, then by workspace and key; each with its weight (1 without a
    fairness_key row)."""
    from jobqueue.lifecycle.fairness import DEFAULT_WEIGHT
    from jobqueue.models import FairnessKey, Job

    if top <= 0:
        return []
    rows = list(
        Job.objects.filter(fairness_key__isnull=False,
                           status__in=[states.QUEUED, states.IN_PROGRESS])
        .order_by().values("workspace_id", "fairness_key")
        .annotate(
            queued=Count("id", filter=Q(status=states.QUEUED)),
            running=Count("id", filter=Q(status=states.IN_PROGRESS)),
        )
        .order_by("-queued", "-running", "workspace_id", "fairness_key")[:top]
    )
    weights = {}
    if rows:
        listed = Q()
        for row in rows:
            listed |= Q(workspace_id=row["workspace_id"], key=row["fairness_key"])
        weights = {(ws, key): weight for ws, key, weight in
                   FairnessKey.objects.filter(listed).values_list("workspace_id", "key",
                                                                   "weight")}
    return [FairKeyStats(row["workspace_id"], row["fairness_key"],
                         weights.get((row["workspace_id"], row["fairness_key"]), DEFAULT_WEIGHT),
                         row["queued"], row["running"]) for row in rows]


def queued_weights(workspace_ids) -> dict:
    """{workspace_id: the sum of the weights of its fairness keys with jobs queued} (a key
    without a fairness_key row weighs 1): each key with jobs queued counted once, plus what
    the weights set add to it. Two queries, on the job table's partial index
    job_fair_key_idx."""
    from jobqueue.lifecycle.fairness import DEFAULT_WEIGHT
    from jobqueue.models import FairnessKey, Job

    workspace_ids = list(workspace_ids)
    if not workspace_ids:
        return {}
    queued = Job.objects.filter(workspace_id__in=workspace_ids, status=states.QUEUED,
                                fairness_key__isnull=False).order_by()
    totals = {ws: n * DEFAULT_WEIGHT for ws, n in queued.values("workspace_id").annotate(
        n=Count("fairness_key", distinct=True)).values_list("workspace_id", "n")}
    weighted = (
        FairnessKey.objects.filter(workspace_id__in=workspace_ids)
        .filter(Exists(_fair_jobs().filter(status=states.QUEUED)))
        .order_by().values("workspace_id")
        .annotate(more=Sum(F("weight") - DEFAULT_WEIGHT)).values_list("workspace_id", "more")
    )
    for ws, more in weighted:
        totals[ws] = totals.get(ws, 0) + (more or 0)
    return totals
