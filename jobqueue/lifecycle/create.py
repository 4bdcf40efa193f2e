"""Creating job agents and jobs, and dispatching held jobs (pending -> queued)."""

from __future__ import annotations

import hashlib
import json

from django.db import IntegrityError, transaction
from django.db.models.functions import Now

from jobqueue import observe, states, wakeups
from jobqueue.db import NowPlusSeconds, db_now
from jobqueue.exceptions import IdempotencyKeyReused, InvalidInput, InvalidTransition, NotFound
from jobqueue.models import Job, JobAgent, JobEvent

from . import inputs
from .groups import hold_group, holding_group
from .records import event, fetch_job, scoped_jobs


def create_job_agent(*, workspace, name: str, lease_seconds: int | None = None,
                     max_attempts: int | None = None,
                     max_runtime_seconds: int | None = None) -> JobAgent:
    agent = JobAgent(
        workspace=workspace,
        name=inputs.agent_name(name),
        lease_seconds=inputs.lease_seconds(lease_seconds),
        max_attempts=inputs.max_attempts(max_attempts),
        max_runtime_seconds=inputs.max_runtime_seconds(max_runtime_seconds),
    )
    try:
        with transaction.atomic():
            agent.save()
    except IntegrityError as exc:
        raise InvalidInput("A job agent with this name already exists.", field="name") from exc
    return agent


def _fingerprint(payload: dict) -> str:
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _request_payload(job_agent, job_agent_config, dispatch_context, priority, max_attempts,
                     delay_seconds, external_id, hold) -> dict:
    """What the producer sent, as the idempotency fingerprint sees it.

    `max_attempts` is as sent (None when omitted), never the agent's or the service's
    default: an operator changing those must not turn a byte-identical replay into a
    422. The other fields have constant defaults ({} for the JSON objects, priority 0,
    external_id "", hold false), so sending one of those is the same request as omitting
    it."""
    return {
        "job_agent": str(job_agent.id),
        "job_agent_config": job_agent_config or {},
        "dispatch_context": dispatch_context or {},
        "priority": priority,
        "max_attempts": max_attempts,
        "delay_seconds": delay_seconds,
        "external_id": external_id,
        "hold": hold,
    }


# Fingerprints of this shape carry a version key, so none of them equals one made before
# (when max_attempts was fingerprinted with its default filled in).
_FINGERPRINT_VERSION = 2


def create_job(
    *,
    workspace,
    job_agent: JobAgent,
    job_agent_config: dict | None = None,
    dispatch_context: dict | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    delay_seconds: int | None = None,
    retry_backoff_seconds: int | None = None,
    max_runtime_seconds: int | None = None,
    expires_at=None,
    external_id: str = "",
    idempotency_key: str | None = None,
    group: str | None = None,
    hold: bool = False,
    actor: str = "",
) -> tuple[Job, bool]:
    """Create a job (queued, or pending when `hold`). Returns (job, created).

    With an idempotency key, a replay of the same request returns the first job and
    created=False; the same key with different content raises IdempotencyKeyReused.
    A job joins `group` only while the group is not cancelled (else GroupCancelled).
    """
    if job_agent.workspace_id != workspace.id:
        raise NotFound("No such job agent.")
    sent_max_attempts = inputs.max_attempts(max_attempts)
    max_attempts = sent_max_attempts or job_agent.effective_max_attempts
    delay_seconds = inputs.delay_seconds(delay_seconds)
    group = inputs.group_name(group)
    retry_backoff_seconds = inputs.retry_backoff_seconds(retry_backoff_seconds)
    max_runtime_seconds = inputs.max_runtime_seconds(max_runtime_seconds)
    expires_at = inputs.expires_at(expires_at)
    # Fields added later join the fingerprint only when given, so that a replay of a request
    # made before they existed still matches its job.
    later = {"retry_backoff_seconds": retry_backoff_seconds,
             "max_runtime_seconds": max_runtime_seconds,
             "expires_at": None if expires_at is None else expires_at.isoformat(),
             "group": group}
    fingerprint = ""
    payload: dict = {}
    if inputs.idempotency_key(idempotency_key) is not None:
        payload = _request_payload(job_agent, job_agent_config, dispatch_context, priority,
                                   sent_max_attempts, delay_seconds, external_id, hold)
        payload.update({k: v for k, v in later.items() if v is not None})
        fingerprint = _fingerprint({**payload, "v": _FINGERPRINT_VERSION})
        existing = Job.objects.filter(workspace=workspace, idempotency_key=idempotency_key).first()
        if existing is not None:
            return _idempotent_replay(existing, fingerprint, payload), False

    inputs.expires_at_ahead(expires_at, db_now)
    job = Job(
        workspace=workspace,
        job_agent=job_agent,
        status=states.PENDING if hold else states.QUEUED,
        job_agent_config=job_agent_config or {},
        dispatch_context=dispatch_context or {},
        priority=priority,
        max_attempts=max_attempts,
        initial_max_attempts=max_attempts,
        retry_backoff_seconds=retry_backoff_seconds,
        # The agent's default applies when the producer gives none.
        max_runtime_seconds=max_runtime_seconds or job_agent.max_runtime_seconds,
        expires_at=expires_at,
        external_id=external_id or "",
        group=group,
        idempotency_key=idempotency_key,
        idempotency_fingerprint=fingerprint,
    )
    if delay_seconds:
        job.available_at = NowPlusSeconds(delay_seconds)
    def insert(reopen: bool) -> None:
        with transaction.atomic():
            if group is not None:
                hold_group(workspace.id, group, create=True, reopen=reopen)
            job.save(force_insert=True)
            event(job.id, JobEvent.CREATED, actor=actor, status=job.status).save()
            if not hold:
                wakeups.announce(wakeups.agent_key(job_agent.id), delay=delay_seconds or 0)

    try:
        holding_group(insert)
    except IntegrityError:
        if idempotency_key is None:
            raise
        existing = Job.objects.filter(workspace=workspace, idempotency_key=idempotency_key).first()
        if existing is None:
            raise
        return _idempotent_replay(existing, fingerprint, payload), False
    if delay_seconds:
        job.refresh_from_db(fields=["available_at"])
    observe.emit("created", job_agent_id=job_agent.id)
    return job, True


def _idempotent_replay(existing: Job, fingerprint: str, payload: dict) -> Job:
    """The first job, whatever the defaults are now, when the request is the same."""
    if existing.idempotency_fingerprint == fingerprint or (
        payload["max_attempts"] is None
        and existing.idempotency_fingerprint
        == _fingerprint({**payload, "max_attempts": existing.initial_max_attempts})
    ):
        # The second form is a job created before fingerprints were versioned: its
        # fingerprint holds the default max_attempts it was created with.
        return existing
    raise IdempotencyKeyReused()


def dispatch_job(job_id, *, workspace_id=None, actor: str = "") -> Job:
    """pending -> queued (the producer releases its hold)."""
    with transaction.atomic():
        n = (
            scoped_jobs(workspace_id)
            .filter(id=job_id, status=states.PENDING)
            .update(status=states.QUEUED, available_at=Now(), updated_at=Now())
        )
        if n == 1:
            job = Job.objects.get(id=job_id)
            event(job.id, JobEvent.DISPATCHED, attempt=job.attempt, actor=actor).save()
            wakeups.announce(wakeups.agent_key(job.job_agent_id))
            return job
    job = fetch_job(job_id, workspace_id=workspace_id)
    raise InvalidTransition(f"Only a pending job can be dispatched; this one is {job.status}.")
