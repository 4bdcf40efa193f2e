"""Flows: a graph of jobs created at once (POST flows; docs/api.md "Dependencies and flows").

Each job of a flow has a `ref` (its name in the flow) and may depend on jobs named earlier in
the list (`depends_on_refs`, so no cycle can be written) and on existing jobs of the
workspace (`depends_on`). The whole flow is one transaction with one INSERT per table (jobs,
edges, events): all of it or nothing. Its jobs start as create_job's would: queued when they
wait for nothing (or everything they wait for already succeeded), pending while they wait,
cancelled (dependency_failed) when an existing parent already ended otherwise.
"""

from __future__ import annotations

import dataclasses
import uuid

from django.db import transaction
from django.db.models.functions import Now

from jobqueue import observe, states, wakeups
from jobqueue.conf import jobqueue_settings
from jobqueue.db import NowPlusSeconds, db_now
from jobqueue.exceptions import InvalidInput
from jobqueue.models import Job, JobAgent, JobDependency, JobEvent

from . import dependencies, fairness, inputs
from .create import held_until_admitted
from .create import label_set as stored_label_set
from .finished import announce_finished
from .groups import hold_group, holding_group
from .records import event

MAX_FLOW_JOBS = 1000
MAX_REF_LENGTH = 200


@dataclasses.dataclass
class FlowJob:
    """One job of a flow, as create_job takes it, with its ref and dependencies."""

    ref: str
    job_agent: JobAgent | None  # exactly one of job_agent and labels
    labels: list | None = None
    job_agent_config: dict | None = None
    dispatch_context: dict | None = None
    priority: int = 0
    max_attempts: int | None = None
    delay_seconds: int | None = None
    retry_backoff_seconds: int | None = None
    max_runtime_seconds: int | None = None
    expires_at: object = None
    external_id: str = ""
    group: str | None = None
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    rate_limit_key: str | None = None
    fairness_key: str | None = None
    depends_on_refs: list = dataclasses.field(default_factory=list)
    depends_on: list | None = None


def _field(index: int, name: str) -> str:
    return f"jobs[{index}].{name}"


def _checked(index: int, rule, *args):
    """rule(*args), its InvalidInput naming the field within the flow (jobs[i].field)."""
    try:
        return rule(*args)
    except InvalidInput as exc:
        field = exc.context.get("field")
        raise InvalidInput(exc.detail, field=_field(index, field) if field else "jobs") from exc


def _place_fairly(workspace_id, rows: list[Job]) -> None:
    """Each job with a fairness key its place in claim order (lifecycle/fairness.py), as
    create_job gives one: the first of a key on a route (an agent's own jobs, a label set's)
    after the key's queued jobs there, the flow's next ones of the key on the route one place
    (STEP / its weight) after it."""
    last: dict[tuple, object] = {}
    steps: dict[str, object] = {}
    for job in rows:
        key = job.fairness_key
        if key is None:
            continue
        placed = (key, job.job_agent_id if job.label_set_id is None else None, job.label_set_id,
                  job.priority)
        if placed in last:
            if key not in steps:
                steps[key] = fairness.STEP / fairness.weight_of(workspace_id, key)
            job.fair_at = last[placed] + steps[key]
        else:
            job.fair_at = fairness.place(job)
        last[placed] = job.fair_at


def create_flow(*, workspace, jobs: list[FlowJob], actor: str = "") -> dict[str, Job]:
    """Create every job of the flow in one transaction: {ref: job}, in the flow's order.
    Bad input (a ref used twice or naming no earlier job, more than MAX_DEPENDENCIES
    dependencies, an unknown parent, a field out of bounds) is InvalidInput naming
    jobs[i].field, and nothing is created."""
    if not 1 <= len(jobs) <= MAX_FLOW_JOBS:
        raise InvalidInput(f"From 1 to {MAX_FLOW_JOBS} jobs.", field="jobs")
    refs: dict[str, int] = {}
    rows: list[Job] = []
    sets: dict[str, object] = {}  # the flow's label sets, one query each

    def label_set(labels):
        key = ",".join(labels)
        if key not in sets:
            sets[key] = stored_label_set(workspace.id, labels)
        return sets[key]

    plan = []  # (job, in-flow parent indexes, existing parent ids, delay)
    for i, item in enumerate(jobs):
        if not isinstance(item.ref, str) or not 1 <= len(item.ref) <= MAX_REF_LENGTH:
            raise InvalidInput(f"1 to {MAX_REF_LENGTH} characters.", field=_field(i, "ref"))
        if item.ref in refs:
            raise InvalidInput("Each ref names one job of the flow.", field=_field(i, "ref"))
        if (item.job_agent is None) == (item.labels is None):
            raise InvalidInput("A job targets exactly one of job_agent_id and labels.",
                               field=_field(i, "job_agent_id"))
        labels = None if item.labels is None else _checked(i, inputs.job_labels, item.labels)
        if item.job_agent is not None and item.job_agent.workspace_id != workspace.id:
            raise InvalidInput("No such job agent in this workspace.",
                               field=_field(i, "job_agent_id"))
        earlier = []
        for ref in item.depends_on_refs:
            if ref not in refs:
                raise InvalidInput(f"{ref!r} names no earlier job of the flow.",
                                   field=_field(i, "depends_on_refs"))
            earlier.append(refs[ref])
        earlier = list(dict.fromkeys(earlier))
        existing = () if item.depends_on is None else _checked(
            i, inputs.depends_on, item.depends_on)
        if len(earlier) + len(existing) > inputs.MAX_DEPENDENCIES:
            raise InvalidInput(f"At most {inputs.MAX_DEPENDENCIES} dependencies.",
                               field=_field(i, "depends_on_refs"))
        refs[item.ref] = i
        max_attempts = (_checked(i, inputs.max_attempts, item.max_attempts)
                        or (jobqueue_settings()["DEFAULT_MAX_ATTEMPTS"] if labels
                            else item.job_agent.effective_max_attempts))
        expires_at = _checked(i, inputs.expires_at, item.expires_at)
        delay = _checked(i, inputs.delay_seconds, item.delay_seconds)
        concurrency_key, concurrency_limit = _checked(
            i, inputs.concurrency, item.concurrency_key, item.concurrency_limit)
        rate_limit_key = _checked(i, inputs.rate_limit_key, item.rate_limit_key)
        fairness_key = _checked(i, inputs.fairness_key, item.fairness_key)
        job = Job(
            id=uuid.uuid4(), workspace=workspace, job_agent=item.job_agent,
            labels=labels, label_set=None if labels is None else label_set(labels),
            status=states.QUEUED,
            job_agent_config=item.job_agent_config or {},
            dispatch_context=item.dispatch_context or {},
            priority=item.priority, max_attempts=max_attempts,
            initial_max_attempts=max_attempts,
            retry_backoff_seconds=_checked(i, inputs.retry_backoff_seconds,
                                           item.retry_backoff_seconds),
            max_runtime_seconds=(_checked(i, inputs.max_runtime_seconds,
                                          item.max_runtime_seconds)
                                 or getattr(item.job_agent, "max_runtime_seconds", None)),
            expires_at=expires_at, external_id=item.external_id or "",
            group=_checked(i, inputs.group_name, item.group),
            concurrency_key=concurrency_key, concurrency_limit=concurrency_limit,
            rate_limit_key=rate_limit_key, fairness_key=fairness_key,
            has_parents=bool(earlier or existing),
        )
        if delay:
            job.available_at = NowPlusSeconds(delay)
        rows.append(job)
        plan.append((job, earlier, existing, delay))
    if any(job.expires_at is not None for job in rows):
        for i, job in enumerate(rows):
            _checked(i, inputs.expires_at_ahead, job.expires_at, db_now)
    for _job, earlier, _existing, _delay in plan:
        for parent in earlier:
            rows[parent].has_dependents = True

    def insert(reopen: bool) -> None:
        with transaction.atomic():
            for group in sorted({job.group for job in rows if job.group is not None}):
                hold_group(workspace.id, group, create=True, reopen=reopen)
            statuses: dict = {}
            outside = sorted({p for _j, _e, existing, _d in plan for p in existing})
            if outside:
                found = dict(Job.objects.filter(workspace_id=workspace.id, id__in=outside)
                             .values_list("id", "status"))
                for i, (_job, _earlier, existing, _delay) in enumerate(plan):
                    if any(p not in found for p in existing):
                        raise InvalidInput("Each dependency must be a job of this workspace.",
                                           field=_field(i, "depends_on"))
                statuses = dependencies.hold_parents(workspace.id, outside, "jobs")
            for job, earlier, existing, _delay in plan:
                if not job.has_parents:
                    continue
                mine = {p: statuses[p] for p in existing}
                mine.update({rows[e].id: rows[e].status for e in earlier})
                job.status, job.message = dependencies.initial_state(mine)
                if job.status == states.CANCELLED:
                    job.completed_at = Now()
            _place_fairly(workspace.id, rows)
            for job in rows:
                held_until_admitted(job)
            Job.objects.bulk_create(rows)
            JobDependency.objects.bulk_create([
                JobDependency(child_id=job.id, parent_id=p)
                for job, earlier, existing, _delay in plan
                for p in [*(rows[e].id for e in earlier), *existing]])
            JobEvent.objects.bulk_create([
                event(job.id, JobEvent.CREATED, actor=actor, status=job.status,
                      **({"depends_on": len(earlier) + len(existing)}
                         if job.has_parents else {}))
                for job, earlier, existing, _delay in plan])
            ended = [(job.id, workspace.id, job.status) for job in rows
                     if job.status == states.CANCELLED]
            announce_finished(ended, actor=actor)
            woken = {(wakeups.route_key(job), delay or 0) for job, _e, _x, delay in plan
                     if job.status == states.QUEUED}
            for delay in sorted({delay for _key, delay in woken}):
                wakeups.announce_many(sorted(key for key, d in woken if d == delay), delay)

    holding_group(insert)
    made = {job.id: job for job in Job.objects.filter(id__in=[job.id for job in rows])}
    for agent_id in {job.job_agent_id for job in rows}:
        observe.emit("created", job_agent_id=agent_id,
                     count=sum(1 for job in rows if job.job_agent_id == agent_id))
    return {item.ref: made[job.id] for item, job in zip(jobs, rows, strict=True)}
