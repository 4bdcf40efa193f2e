"""Creating job agents and jobs, and dispatching held jobs (pending -> queued)."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math

from django.db import IntegrityError, transaction
from django.db.models import Case, Value, When
from django.db.models.functions import Now

from jobqueue import observe, states, wakeups
from jobqueue.conf import jobqueue_settings
from jobqueue.db import NowPlusSeconds, db_now
from jobqueue.exceptions import (
    IdempotencyKeyReused,
    InvalidInput,
    InvalidTransition,
    NotFound,
    UniqueKeyConflict,
)
from jobqueue.models import Job, JobAgent, JobDependency, JobEvent, JobLabelSet

from . import dependencies, fairness, inputs
from .backends import backend
from .finished import announce_finished
from .groups import hold_group, holding_group
from .records import event, fetch_job, scoped_jobs
from .results import JobCreated


def create_job_agent(*, workspace, name: str, lease_seconds: int | None = None,
                     max_attempts: int | None = None,
                     max_runtime_seconds: int | None = None,
                     labels=(), name_taken: type[Exception] | None = None) -> JobAgent:
    """A new job agent. A name its workspace has already: InvalidInput naming `name` (POST
    job-agents), or `name_taken` when given (a registration's 409)."""
    agent = JobAgent(
        workspace=workspace,
        name=inputs.agent_name(name),
        lease_seconds=inputs.lease_seconds(lease_seconds),
        max_attempts=inputs.max_attempts(max_attempts),
        max_runtime_seconds=inputs.max_runtime_seconds(max_runtime_seconds),
        labels=inputs.labels(list(labels)),
    )
    try:
        with transaction.atomic():
            agent.save()
    except IntegrityError as exc:
        if name_taken is not None:
            raise name_taken() from exc
        raise InvalidInput("A job agent with this name already exists.", field="name") from exc
    return agent


def update_job_agent(agent: JobAgent, **fields) -> JobAgent:
    """Change the agent's `labels`, `lease_seconds`, `max_attempts` or
    `max_runtime_seconds` (those given; None returns a default to the service's). A request
    reads the agent when it starts: a long-poll held across the change may go on with the
    labels it started with (docs/api.md, "When labels change")."""
    rules = {"labels": lambda v: inputs.labels(list(v)), "lease_seconds": inputs.lease_seconds,
             "max_attempts": inputs.max_attempts,
             "max_runtime_seconds": inputs.max_runtime_seconds}
    unknown = set(fields) - set(rules)
    if unknown:
        raise InvalidInput(f"A job agent's {sorted(unknown)[0]} cannot be changed.",
                           field=sorted(unknown)[0])
    changes = {name: rules[name](value) for name, value in fields.items()}
    if changes:
        JobAgent.objects.filter(id=agent.id).update(**changes)
        for name, value in changes.items():
            setattr(agent, name, value)
    return agent


def _fingerprint(payload: dict) -> str:
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def held_until_admitted(job: Job) -> None:
    """A queued job with a concurrency key or a rate limit key is inserted held back, until
    its key gives it a slot or a permit (the triggers of migrations 0027 and 0029; PostgreSQL's
    BEFORE INSERT triggers say the same): so the order in which SQLite fires its AFTER INSERT
    triggers cannot give a permit to a job before it holds its slot."""
    queued = job.status == states.QUEUED
    job.concurrency_held = True if queued and job.concurrency_key is not None else None
    job.rate_held = True if queued and job.rate_limit_key is not None else None


def _request_payload(job_agent, job_agent_config, dispatch_context, priority, max_attempts,
                     delay_seconds, external_id, hold) -> dict:
    """What the producer sent, as the idempotency fingerprint sees it.

    `max_attempts` is as sent (None when omitted), never the agent's or the service's
    default: an operator changing those must not turn a byte-identical replay into a
    422. The other fields have constant defaults ({} for the JSON objects, priority 0,
    external_id "", hold false), so sending one of those is the same request as omitting
    it."""
    return {
        "job_agent": str(job_agent.id) if isinstance(job_agent, JobAgent) else job_agent,
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


def label_set(workspace_id, labels: list[str]) -> JobLabelSet:
    """The workspace's row of this label set (sorted, distinct: inputs.job_labels), made by
    the first create that targets it; racing creates make one (the unique constraint)."""
    found, _ = JobLabelSet.objects.get_or_create(
        workspace_id=workspace_id, key=",".join(labels), defaults={"labels": labels})
    return found


def create_job(
    *,
    workspace,
    job_agent: JobAgent | None = None,
    labels: list[str] | None = None,
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
    unique_key: str | None = None,
    unique_states=None,
    on_conflict: str | None = None,
    debounce_seconds: int | None = None,
    debounce_max_seconds: int | None = None,
    depends_on=None,
    concurrency_key: str | None = None,
    concurrency_limit: int | None = None,
    rate_limit_key: str | None = None,
    fairness_key: str | None = None,
    schedule_id=None,
    scheduled_for=None,
    actor: str = "",
) -> JobCreated:
    """Create a job (queued, or pending when `hold`). Returns (job, created), a JobCreated.

    With an idempotency key, a replay of the same request returns the first job and
    created=False; the same key with different content raises IdempotencyKeyReused.
    A job joins `group` only while the group is not cancelled (else GroupCancelled).
    With a unique_key, a live job of the workspace with the key is answered instead of a
    new one (created=False, deduplicated=True), replaced or debounced in place as the
    options say (_meet_live). `schedule_id` and `scheduled_for` are a schedule's fire's
    (lifecycle/schedules.py), never a producer's.
    With `depends_on` (job ids of the workspace), the job waits pending until they all
    succeed (lifecycle/dependencies.py): queued at once when they already have, cancelled
    (dependency_failed) when one already ended otherwise.
    A job targets exactly one of `job_agent` and `labels` (1 to 16): a labelled job is
    claimable by every agent of the workspace whose labels include all of them
    (jobqueue/claimrule.py), and takes the service's defaults (max_attempts) where a job of
    an agent takes its agent's.
    With `concurrency_key` (and `concurrency_limit`, default 1), the job is claimable only
    while fewer than its limit of the workspace's jobs with the key are in progress
    (inputs.concurrency; docs/api.md, "Concurrency keys"). With `rate_limit_key`, it is
    claimable only while its key's rate limit, if one is set, lets a claim through
    (docs/api.md, "Rate limits"). With `fairness_key`, it takes its place in claim order by
    its key's share (lifecycle/fairness.py; docs/api.md, "Fair shares").
    """
    if (job_agent is None) == (labels is None):
        raise InvalidInput("A job targets exactly one of job_agent_id and labels.",
                           field="labels" if labels is not None else "job_agent_id")
    if labels is not None:
        labels = inputs.job_labels(labels)
    elif job_agent.workspace_id != workspace.id:
        raise NotFound("No such job agent.")
    sent_max_attempts = inputs.max_attempts(max_attempts)
    max_attempts = sent_max_attempts or (
        jobqueue_settings()["DEFAULT_MAX_ATTEMPTS"] if job_agent is None
        else job_agent.effective_max_attempts)
    delay_seconds = inputs.delay_seconds(delay_seconds)
    group = inputs.group_name(group)
    retry_backoff_seconds = inputs.retry_backoff_seconds(retry_backoff_seconds)
    max_runtime_seconds = inputs.max_runtime_seconds(max_runtime_seconds)
    expires_at = inputs.expires_at(expires_at)
    unique = inputs.uniqueness(unique_key, unique_states, on_conflict, debounce_seconds,
                               debounce_max_seconds)
    parents = inputs.depends_on(depends_on)
    concurrency = inputs.concurrency(concurrency_key, concurrency_limit)
    rate_limit_key = inputs.rate_limit_key(rate_limit_key)
    fairness_key = inputs.fairness_key(fairness_key)
    if parents is not None and hold:
        raise InvalidInput("A job with dependencies is queued by them: no hold.",
                           field="depends_on")
    # Fields added later join the fingerprint only when given, so that a replay of a request
    # made before they existed still matches its job.
    later = {"retry_backoff_seconds": retry_backoff_seconds,
             "max_runtime_seconds": max_runtime_seconds,
             "expires_at": None if expires_at is None else expires_at.isoformat(),
             "group": group, "unique_key": unique_key,
             "unique_states": None if unique_states is None else sorted(unique_states),
             "on_conflict": on_conflict, "debounce_seconds": debounce_seconds,
             "debounce_max_seconds": debounce_max_seconds,
             "depends_on": None if parents is None else sorted(str(p) for p in parents),
             "concurrency_key": concurrency_key, "concurrency_limit": concurrency_limit,
             "rate_limit_key": rate_limit_key, "fairness_key": fairness_key}
    fingerprint = ""
    payload: dict = {}
    if inputs.idempotency_key(idempotency_key) is not None:
        payload = _request_payload(job_agent if labels is None else {"labels": labels},
                                   job_agent_config, dispatch_context, priority,
                                   sent_max_attempts, delay_seconds, external_id, hold)
        payload.update({k: v for k, v in later.items() if v is not None})
        fingerprint = _fingerprint({**payload, "v": _FINGERPRINT_VERSION})
        existing = Job.objects.filter(workspace=workspace, idempotency_key=idempotency_key).first()
        if existing is not None:
            return JobCreated(_idempotent_replay(existing, fingerprint, payload), False)

    inputs.expires_at_ahead(expires_at, db_now)
    job = Job(
        workspace=workspace,
        job_agent=job_agent,
        labels=labels,
        label_set=None if labels is None else label_set(workspace.id, labels),
        status=states.PENDING if hold else states.QUEUED,
        job_agent_config=job_agent_config or {},
        dispatch_context=dispatch_context or {},
        priority=priority,
        max_attempts=max_attempts,
        initial_max_attempts=max_attempts,
        retry_backoff_seconds=retry_backoff_seconds,
        # The agent's default applies when the producer gives none.
        max_runtime_seconds=max_runtime_seconds or getattr(job_agent, "max_runtime_seconds",
                                                           None),
        expires_at=expires_at,
        external_id=external_id or "",
        group=group,
        idempotency_key=idempotency_key,
        idempotency_fingerprint=fingerprint,
        unique_key=None if unique is None else unique.key,
        concurrency_key=concurrency[0],
        concurrency_limit=concurrency[1],
        rate_limit_key=rate_limit_key,
        fairness_key=fairness_key,
        schedule_id=schedule_id,
        scheduled_for=scheduled_for,
    )
    if unique is not None and unique.debounce_seconds is not None:
        # A debounced job waits its quiet period from the first create too (no further than
        # a push may move it: _latest_start), and keeps its cap (debounce_until).
        quiet = unique.debounce_seconds
        latest = _latest_start(job, quiet)
        if latest is not None:
            quiet = max(0, min(quiet, math.floor((latest - db_now()).total_seconds())))
        delay_seconds = max(delay_seconds or 0, quiet)
        if unique.debounce_max_seconds is not None:
            job.debounce_until = NowPlusSeconds(unique.debounce_max_seconds)
    if delay_seconds:
        job.available_at = NowPlusSeconds(delay_seconds)
    met: list[Job] = []

    def insert(reopen: bool) -> None:
        with transaction.atomic():
            if unique is not None:
                live = _meet_live(workspace, unique, job, delay_seconds, actor,
                                  idempotency_key)
                if live is not None:
                    met.append(live)
                    return
            if group is not None:
                hold_group(workspace.id, group, create=True, reopen=reopen)
            if parents is not None:
                statuses = dependencies.hold_parents(workspace.id, parents, "depends_on")
                job.status, job.message = dependencies.initial_state(statuses)
                job.has_parents = True
                if job.status == states.CANCELLED:
                    job.completed_at = Now()
            if fairness_key is not None:
                job.fair_at = fairness.place(job)
            held_until_admitted(job)
            job.save(force_insert=True)
            if parents is not None:
                JobDependency.objects.bulk_create(
                    [JobDependency(child_id=job.id, parent_id=p) for p in parents])
            event(job.id, JobEvent.CREATED, actor=actor, status=job.status,
                  **({} if parents is None else {"depends_on": len(parents)})).save()
            if job.status == states.CANCELLED:
                announce_finished([(job.id, workspace.id, job.status)], actor=actor)
            elif job.status == states.QUEUED:
                wakeups.announce(wakeups.route_key(job), delay=delay_seconds or 0)

    try:
        holding_group(insert)
    except IntegrityError:
        if idempotency_key is None:
            raise
        existing = Job.objects.filter(workspace=workspace, idempotency_key=idempotency_key).first()
        if existing is None:
            raise
        return JobCreated(_idempotent_replay(existing, fingerprint, payload), False)
    if met:
        live = met[0]
        if idempotency_key is not None and live.idempotency_key == idempotency_key:
            # Its own first request, which raced it (the key's lock serialized them).
            return JobCreated(_idempotent_replay(live, fingerprint, payload), False)
        return JobCreated(live, False, deduplicated=True)
    if delay_seconds or job.debounce_until is not None or job.status == states.CANCELLED:
        job.refresh_from_db(fields=["available_at", "debounce_until", "completed_at"])
    observe.emit("created", job_agent_id=job.job_agent_id)
    return JobCreated(job, True)


def live_with_key(workspace_id, unique: inputs.Uniqueness):
    """The workspace's jobs with the key in the statuses `unique` counts as live, the one a
    create meets first: unclaimed ones first, then the newest (job_unique_key_idx)."""
    return (
        Job.objects.filter(workspace_id=workspace_id, unique_key=unique.key,
                           status__in=sorted(unique.live))
        .order_by(Case(When(status__in=sorted(inputs.UNCLAIMED), then=Value(0)),
                       default=Value(1)), "-created_at")
    )


def _meet_live(workspace, unique: inputs.Uniqueness, new: Job, delay_seconds: int | None,
               actor: str, idempotency_key: str | None = None) -> Job | None:
    """In the create's transaction, under the key's lock: the live job with the key that the
    create answers instead of `new` (replaced or debounced in place as `unique` says), or
    None: create `new`.

    Live is what `unique.live` counts (the new create's unique_states). A `replace` or a
    debounce that meets a live job of another job agent raises UniqueKeyConflict, whatever
    its status (it changes nothing and creates nothing). An unclaimed one (pending, queued)
    comes first: `replace` updates its dispatch_context, priority and available_at (now +
    delay_seconds, at most its debounce_until); a debounce, on a queued one, takes the
    dispatch_context and pushes available_at to now + debounce_seconds, never earlier than
    it was, nor past the job's debounce_until or its _latest_start. A claimed one
    (in_progress) is answered as is, unless `replace`: then a new job is created beside it.
    The job that this request's own Idempotency-Key made is answered unchanged (a retry
    racing its first send: create_job answers it as a replay)."""
    backend().lock_unique_key(workspace.id, unique.key)
    live = live_with_key(workspace.id, unique).first()
    if live is None:
        return None
    if idempotency_key is not None and live.idempotency_key == idempotency_key:
        return live
    if ((unique.replace or unique.debounce_seconds is not None)
            and _target(live) != _target(new)):
        raise UniqueKeyConflict(
            f"The live job {live.id} with this unique_key targets another job agent (or "
            "label set) than this create's; a replace or a debounce changes only a job of "
            "the create's own target. Nothing was changed.", job_id=str(live.id))
    if live.status not in inputs.UNCLAIMED:
        return None if unique.replace else live
    debounce = unique.debounce_seconds is not None and live.status == states.QUEUED
    if not (unique.replace or debounce):
        return live
    changes = {"dispatch_context": new.dispatch_context, "updated_at": Now()}
    if unique.replace:
        changes["priority"] = new.priority
    wait = delay_seconds or 0
    if debounce or live.debounce_until is not None:
        now = db_now()
        if debounce:
            until = now + dt.timedelta(seconds=unique.debounce_seconds)
            caps = (live.debounce_until, _latest_start(live, unique.debounce_seconds))
            until = min([until, *(cap for cap in caps if cap is not None)])
            changes["available_at"] = max(until, live.available_at)
        else:  # a replace of a debounced job: not past its cap either
            changes["available_at"] = min(now + dt.timedelta(seconds=wait), live.debounce_until)
        wait = max(0, math.ceil((changes["available_at"] - now).total_seconds()))
    else:
        changes["available_at"] = NowPlusSeconds(wait) if wait else Now()
    updated = Job.objects.filter(id=live.id, status=live.status).update(**changes)
    if not updated:  # pragma: no cover -- race: a claim took it between read and update
        # A claim (or a cancel) took it between the read and the update (the key's lock
        # does not hold claims): meet it as it is now.
        return _meet_live(workspace, unique, new, delay_seconds, actor, idempotency_key)
    event(live.id, JobEvent.REPLACED, attempt=live.attempt, actor=actor,
          **({"debounced": True} if debounce else {})).save()
    if live.status == states.QUEUED:
        wakeups.announce(wakeups.route_key(live), delay=wait)
    live.refresh_from_db()
    return live


def _target(job: Job):
    """What a job targets: its label set, or its agent."""
    return ("labels", job.label_set_id) if job.label_set_id else ("agent", job.job_agent_id)


def _latest_start(job: Job, debounce_seconds: int):
    """The latest available_at a debounce may give `job` (None: no limit): its expires_at
    less the time one attempt may run (max_runtime_seconds), or less the quiet period
    (debounce_seconds) for a job without a runtime limit, so that it can still be claimed
    and run before it expires."""
    if job.expires_at is None:
        return None
    return job.expires_at - dt.timedelta(seconds=job.max_runtime_seconds or debounce_seconds)


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
            # A job with dependencies is queued by them (lifecycle/dependencies.py), not by
            # its producer.
            .filter(id=job_id, status=states.PENDING, has_parents=False)
            .update(status=states.QUEUED, available_at=Now(), updated_at=Now())
        )
        if n == 1:
            job = Job.objects.get(id=job_id)
            event(job.id, JobEvent.DISPATCHED, attempt=job.attempt, actor=actor).save()
            wakeups.announce(wakeups.route_key(job))
            return job
    job = fetch_job(job_id, workspace_id=workspace_id)
    if job.status == states.PENDING:
        raise InvalidTransition("This job waits for its dependencies: they queue it.")
    raise InvalidTransition(f"Only a pending job can be dispatched; this one is {job.status}.")
