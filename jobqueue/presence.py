"""Whether a job agent is online: its one definition.

An agent is online when it was seen (`last_seen_at`: the latest request of any of its tokens,
written by the HTTP edge, agents/health.py) within JOBQUEUE["AGENT_ONLINE_SECONDS"] (120), by
the database's clock. The edge shows it on agents (agents/health.py, `with_health`); the core
counts the online agents a job could go to (jobqueue/explain.py).
"""

from __future__ import annotations

from django.db.models import BooleanField, ExpressionWrapper, Q

from jobqueue.conf import jobqueue_settings
from jobqueue.db import NowPlusSeconds


def online_seconds() -> float:
    return float(jobqueue_settings()["AGENT_ONLINE_SECONDS"])


def online():
    """A boolean the database computes with an agent's row: seen within AGENT_ONLINE_SECONDS."""
    return ExpressionWrapper(
        Q(last_seen_at__isnull=False) & Q(last_seen_at__gt=NowPlusSeconds(-online_seconds())),
        output_field=BooleanField())
