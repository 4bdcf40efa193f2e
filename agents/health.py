"""Agent health: when it was last seen, how many jobs it holds, how many leases it lost.

`last_seen_at` is written at most every JOBQUEUE["AGENT_SEEN_WRITE_SECONDS"] (default 15 s)
per process per agent, into `job_agent` only: never per request, never into `job`.
"""

from __future__ import annotations

import logging
import threading
import time

from django.db import DatabaseError
from django.db.models import Count, IntegerField, OuterRef, Subquery, Value
from django.db.models.functions import Coalesce, Now

from jobqueue.conf import jobqueue_settings
from jobqueue.db import NowPlusSeconds
from jobqueue.models import JobAgent, JobClaim, JobEvent

log = logging.getLogger("agents.health")

EXPIRED_WINDOW_SECONDS = 24 * 3600
_seen_lock = threading.Lock()
_seen_written: dict = {}  # job_agent_id -> time.monotonic() of this process's last write


def note_agent_seen(job_agent_id) -> bool:
    """Record that the agent made a request; returns whether this call wrote."""
    every = float(jobqueue_settings()["AGENT_SEEN_WRITE_SECONDS"])
    now = time.monotonic()
    with _seen_lock:
        last = _seen_written.get(job_agent_id)
        if last is not None and now - last < every:
            return False
        _seen_written[job_agent_id] = now
    try:
        JobAgent.objects.filter(id=job_agent_id).update(last_seen_at=Now())
    except DatabaseError:  # health must never fail the agent's request
        log.warning("could not record last_seen_at for job agent %s", job_agent_id)
        return False
    return True


def forget_seen() -> None:
    """Forget this process's write times (tests)."""
    with _seen_lock:
        _seen_written.clear()


def with_health(queryset):
    """Annotate job agents with jobs_in_flight and leases_expired_24h (two subqueries)."""
    in_flight = (
        JobClaim.objects.filter(job_agent_id=OuterRef("pk"))
        .order_by()
        .values("job_agent_id")
        .annotate(n=Count("pk"))
        .values("n")
    )
    expired = (
        JobEvent.objects.filter(
            job__job_agent_id=OuterRef("pk"),
            created_at__gte=NowPlusSeconds(-EXPIRED_WINDOW_SECONDS),
        )
        .filter(kind__in=[JobEvent.REAPED, JobEvent.EXPIRED])  # job_event_lease_lost_idx
        .order_by()
        .values("job__job_agent_id")
        .annotate(n=Count("pk"))
        .values("n")
    )
    return queryset.annotate(
        jobs_in_flight=Coalesce(Subquery(in_flight, output_field=IntegerField()), Value(0)),
        leases_expired_24h=Coalesce(Subquery(expired, output_field=IntegerField()), Value(0)),
    )
