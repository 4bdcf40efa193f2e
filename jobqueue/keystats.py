"""Concurrency keys, key by key: what /metrics (ops/metrics.py) and the admin's "Concurrency
keys" page (jobqueue/admin/concurrency.py) show of them, read from the job table when asked.

A key belongs to a workspace (docs/api.md, "Concurrency keys"). Of each key: `running`, its
jobs in progress; `held`, its queued jobs its slots keep back (concurrency_held: the triggers
of migration 0027 set and clear it); `waiting`, its queued jobs given a slot that no claim took
yet; `limit`, the largest concurrency_limit among its live jobs (each job has its own; they
agree unless producers disagree). Only the keys with something held back or running are
listed, the most held back first: a bounded number of them (JOBQUEUE_METRICS_TOP_KEYS on
/metrics), so that a workspace with a key per customer does not make a series per customer.
One query: a GROUP BY over the live jobs with a key.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Count, Max, Q

from jobqueue import states


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
