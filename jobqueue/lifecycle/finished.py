"""The one place a terminal transition announces itself: the webhook outbox and
`jobqueue.signals.job_finished`.

Every path that ends a job calls `announce_finished` once, with the jobs it ended, inside the
transaction that ended them: it writes one `webhook_delivery` row per job and endpoint of the
job's workspace that wants `job.finished` (the outbox: it commits or rolls back with the
transition), and registers the signal with `transaction.on_commit` (sent when that transaction
commits, never when it rolls back). Never for a write that changed nothing (a refused report,
a retried final report, cancelling a cancelled job). A new path that ends jobs (clocks,
retries, group cancel) calls it the same way.

PostgreSQL's report statements (jobqueue/sql/postgresql.sql) write their outbox rows in the
statement itself (one autocommit statement is the whole transaction) and so pass
outbox_written=True, as the ORM backend does, which writes them in its own transaction.

Each row's body (payload) is fixed when it is written: the job as it is at the end of the
transition (finished_payload), so a later requeue, report or prune changes nothing a receiver
gets. The report statements build the same document in SQL (jobqueue_finished_payload,
migration 0014); tests/integration/core/test_webhooks.py compares the two.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import UTC

from django.db import transaction

from jobqueue import signals
from jobqueue.models import Job, WebhookDelivery, WebhookEndpoint

Ended = tuple[uuid.UUID, uuid.UUID, str]  # job_id, workspace_id, terminal status

# A job.finished body's `job`: the job as the API shows it, never its dispatch_context.
JOB_FIELDS = ("id", "workspace_id", "job_agent_id", "status", "job_agent_config", "result",
              "message", "external_id", "attempt", "max_attempts", "priority", "available_at",
              "created_at", "started_at", "completed_at", "updated_at", "idempotency_key")


def job_document(job: Job) -> dict:
    """The job as a job.finished delivery carries it (JOB_FIELDS; ids as strings, times as
    json_time writes them)."""
    doc = {}
    for name in JOB_FIELDS:
        value = getattr(job, name)
        if hasattr(value, "isoformat"):
            value = json_time(value)
        elif name.endswith("id") and value is not None and name != "external_id":
            value = str(value)
        doc[name] = value
    return doc


def json_time(value) -> str:
    """A time as a delivery carries it: ISO 8601 in UTC, six fractional digits, a Z (the SQL
    of the report statements writes the same)."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def finished_payload(job: Job) -> dict:
    """What a job.finished delivery stores: {"job": job_document(job)}. The body sent adds the
    row's own id, event and created_at (maintenance/webhooks.py, body_of). PostgreSQL's
    report statements store the same with jobqueue_finished_payload (migration 0014)."""
    return {"job": job_document(job)}


def announce_finished(ended: Iterable[Ended], *, actor: str = "",
                      outbox_written: bool = False) -> None:
    """Write the outbox rows and settle the jobs' dependents (unless the caller's statement
    did both: lifecycle/dependencies.py) and send job_finished for each (job_id,
    workspace_id, terminal status) once the current transaction commits."""
    ended = list(ended)
    if not ended:
        return
    if not outbox_written:
        # A report's statement (or the ORM's report) settles the dependents itself.
        from .dependencies import settle

        write_outbox(ended)
        settle(ended)
    transaction.on_commit(lambda: _send(ended, actor))


def write_outbox(ended: list[Ended]) -> int:
    """One pending delivery per ended job and endpoint of its workspace that wants it, its
    body fixed now: the job as this transaction leaves it."""
    endpoints = [
        e for e in WebhookEndpoint.objects.filter(
            workspace_id__in={workspace_id for _, workspace_id, _ in ended}
        ).only("id", "workspace_id", "events")
        if e.wants(WebhookEndpoint.JOB_FINISHED)
    ]
    if not endpoints:
        return 0
    wanted = {e.workspace_id for e in endpoints}
    jobs = Job.objects.filter(id__in=[job_id for job_id, workspace_id, _ in ended
                                      if workspace_id in wanted]).defer("dispatch_context")
    payloads = {job.id: finished_payload(job) for job in jobs}
    rows = [
        WebhookDelivery(endpoint_id=e.id, job_id=job_id, event=WebhookEndpoint.JOB_FINISHED,
                        payload=payloads[job_id])
        for job_id, workspace_id, _status in ended
        for e in endpoints if e.workspace_id == workspace_id
    ]
    WebhookDelivery.objects.bulk_create(rows)
    return len(rows)


def write_group_outbox(finished: list, created_at) -> int:
    """One group.finished delivery per (JobGroup, GroupState) and endpoint of its workspace
    that wants it, its body fixed now: the group as it finished."""
    endpoints = [
        e for e in WebhookEndpoint.objects.filter(
            workspace_id__in={group.workspace_id for group, _ in finished}
        ).only("id", "workspace_id", "events")
        if e.wants(WebhookEndpoint.GROUP_FINISHED)
    ]
    rows = []
    for group, state in finished:
        for e in endpoints:
            if e.workspace_id != group.workspace_id:
                continue
            delivery = WebhookDelivery(endpoint_id=e.id, group_id=group.id,
                                       event=WebhookEndpoint.GROUP_FINISHED,
                                       created_at=created_at)
            delivery.payload = {"id": str(delivery.id), "event": delivery.event,
                                "created_at": json_time(created_at),
                                "group": state.as_document()}
            rows.append(delivery)
    WebhookDelivery.objects.bulk_create(rows)
    return len(rows)


def _send(ended: list[Ended], actor: str) -> None:
    for job_id, _workspace_id, status in ended:
        signals.job_finished.send_robust(sender=Job, job_id=job_id, status=status, actor=actor)


def announce_retrying(jobs: Iterable[Job], *, actor: str = "") -> None:
    """Send job_retrying for each job a retryable failure queued again, once the current
    transaction commits (at once outside one)."""
    retried = [(job.id, job.attempt, job.available_at) for job in jobs]
    if retried:
        transaction.on_commit(lambda: _send_retrying(retried, actor))


def _send_retrying(retried, actor: str) -> None:
    for job_id, attempt, available_at in retried:
        signals.job_retrying.send_robust(sender=Job, job_id=job_id, attempt=attempt,
                                         available_at=available_at, actor=actor)
