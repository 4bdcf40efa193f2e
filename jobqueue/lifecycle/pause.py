"""Pause and resume a job agent: while paused, its claims hand out nothing (claim-next
answers 204 / an empty batch, a named claim 409 `agent_paused`); jobs already claimed go
on (heartbeats, reports and releases are untouched), and nothing else changes but the
slots of concurrency keys: a paused agent's own queued jobs give theirs back, so that jobs
another agent can take get them, and take them again when it resumes (lifecycle/concurrency.py).

Each is one conditional UPDATE of the agent's row, by the database's clock. On PostgreSQL
the claim statement reads `paused_at` under a share lock (jobqueue/sql/postgresql.sql, the gate), so
once a pause has committed no claim hands out a job; on SQLite writers are serialized.
Pausing a paused agent (or resuming a running one) changes nothing and answers the agent.
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.db.models.functions import Now

from jobqueue import observe, wakeups
from jobqueue.models import JobAgent

from . import concurrency, ratelimits

log = logging.getLogger("jobqueue.lifecycle")


def pause_job_agent(job_agent: JobAgent, actor: str, reason: str = "") -> tuple[JobAgent, bool]:
    """Pause the agent's claims: (the agent as it is now, whether this call paused it)."""
    with transaction.atomic():
        changed = JobAgent.objects.filter(id=job_agent.id, paused_at__isnull=True).update(
            paused_at=Now(), paused_by=actor, paused_reason=(reason or "")[:500]
        ) == 1
        if changed:
            concurrency.agent_paused(job_agent.id)
            ratelimits.agent_paused(job_agent.id)
    return _after(job_agent, changed, "paused", actor, reason)


def resume_job_agent(job_agent: JobAgent, actor: str, reason: str = "") -> tuple[JobAgent, bool]:
    """Let the agent claim again: (the agent as it is now, whether this call resumed it).
    Every claim of the agent held waiting (long-poll) re-checks when the resume commits."""
    with transaction.atomic():
        changed = JobAgent.objects.filter(id=job_agent.id, paused_at__isnull=False).update(
            paused_at=None, paused_by="", paused_reason=""
        ) == 1
        if changed:
            concurrency.agent_resumed(job_agent.id)
            ratelimits.agent_resumed(job_agent.id)
            wakeups.announce(wakeups.every_waiter_key(job_agent.id))
    return _after(job_agent, changed, "resumed", actor, reason)


def is_paused(job_agent_id) -> bool:
    """Whether the agent is paused now (read afresh, not from a loaded row)."""
    return JobAgent.objects.filter(id=job_agent_id, paused_at__isnull=False).exists()


def _after(job_agent: JobAgent, changed: bool, kind: str, actor: str, reason: str):
    job_agent.refresh_from_db(fields=["paused_at", "paused_by", "paused_reason"])
    if changed:
        # The reason is the caller's text: kept on the agent, never written to a log line.
        log.info("job agent %s %s by %s", job_agent.id, kind, actor)
        observe.emit(f"agent_{kind}", job_agent_id=job_agent.id)
    return job_agent, changed
