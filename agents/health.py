"""Agent health and presence: when it was last seen, whether it is online, how many jobs it
holds, how many leases it lost.

Presence (docs/api.md, "Presence"): each agent token has `last_used_at`, each agent
`last_seen_at` (the latest request of any of its tokens) and `online` (seen within
JOBQUEUE["AGENT_ONLINE_SECONDS"], 120, by the database's clock: jobqueue/presence.py, which
the core's explain counts with too). A token's first request after
JOBQUEUE["AGENT_SEEN_WRITE_SECONDS"] (60) without one writes both at once; then nothing is
written for that token for as long again, whatever the number of requests, server processes or
replicas: the token row the request's authentication reads says whether a write is due
(`presence_due`, computed by the database), and the write is a conditional UPDATE that only
one of several racing requests wins. So an agent costs at most one token write and one agent
write a minute per token, never one per request, and never a write of `job`.
"""

from __future__ import annotations

import logging

from django.db import DatabaseError, transaction
from django.db.models import (
    BooleanField,
    Count,
    ExpressionWrapper,
    IntegerField,
    OuterRef,
    Q,
    Subquery,
    Value,
)
from django.db.models.functions import Coalesce, Now

from jobqueue.conf import jobqueue_settings
from jobqueue.db import NowPlusSeconds
from jobqueue.models import JobAgent, JobClaim, JobEvent
from jobqueue.presence import online  # the one definition of `online`, with the core's

from .models import AgentToken

log = logging.getLogger("agents.health")

EXPIRED_WINDOW_SECONDS = 24 * 3600


def write_every_seconds() -> float:
    return float(jobqueue_settings()["AGENT_SEEN_WRITE_SECONDS"])


def _stale(field: str, seconds: float) -> Q:
    return Q(**{f"{field}__isnull": True}) | Q(**{f"{field}__lte": NowPlusSeconds(-seconds)})


def presence_due():
    """A boolean the database computes with a token's row: whether a request made with it
    now should record presence (never used, or not for AGENT_SEEN_WRITE_SECONDS)."""
    return ExpressionWrapper(_stale("last_used_at", write_every_seconds()),
                             output_field=BooleanField())


def note_token_used(token_id, job_agent_id) -> bool:
    """Record a request made with the token: its last_used_at and its agent's last_seen_at,
    now. Only when no request of this token has done so for AGENT_SEEN_WRITE_SECONDS (the
    UPDATE's own condition, on the database's clock: of racing requests, one writes). Returns
    whether this call wrote. A failure is logged and swallowed: presence never fails the
    agent's request."""
    try:
        with transaction.atomic():
            wrote = AgentToken.objects.filter(
                _stale("last_used_at", write_every_seconds()), id=token_id,
            ).update(last_used_at=Now())
            if wrote:
                JobAgent.objects.filter(id=job_agent_id).update(last_seen_at=Now())
    except DatabaseError:
        log.warning("could not record last_seen_at for job agent %s", job_agent_id)
        return False
    return bool(wrote)


def with_health(queryset):
    """Annotate job agents with online, jobs_in_flight and leases_expired_24h (two subqueries)."""
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
        online=online(),
        jobs_in_flight=Coalesce(Subquery(in_flight, output_field=IntegerField()), Value(0)),
        leases_expired_24h=Coalesce(Subquery(expired, output_field=IntegerField()), Value(0)),
    )
