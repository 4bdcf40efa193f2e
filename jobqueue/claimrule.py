"""The claim rule: which job a claim may take, and in which order. Its one definition.

A claim takes a job routed to its agent (`routed_to`: the agent's own jobs, which name it and
no labels, and the labelled jobs of its workspace whose labels its own include) that meets
every condition of JOB_CONDITIONS, while the agent meets every condition of AGENT_CONDITIONS,
in ORDER (highest priority first, then the longest available, then the oldest), skipping rows
another claimer holds. Each condition has a name: what a reader that asks "why is this job not
being claimed?" reports when it does not hold (`unmet()`).

Routing. A labelled job's target is its label set (job.label_set, a JobLabelSet row per
distinct set of the workspace): an agent matches it when the agent's labels include every
label of the set (`matches`). A claim finds the sets its agent matches among the workspace's
sets (`label_sets_for`: one row per distinct set, not per job) and reads each one's queued
jobs in claim order (job_label_claim_order_idx), so queued jobs it does not match cost it
nothing. job.job_agent_id of a labelled job names the agent that claimed it last: never a
route (`own_jobs` requires no label set).

Everything that decides claimability derives from here or is held to it by a test:

- the portable ORM claim (jobqueue/lifecycle/orm.py, claim_candidates: `claimable()` in
  `ORDER`, select_for_update(skip_locked=True) in transaction.atomic()), which SQLite runs;
- `Job.objects.claimable()` and `.in_claim_order()` (jobqueue/models.py), which call this;
- the wake-up hub's re-check (jobqueue/wakeups.py: `agents_with_claimable_jobs`);
- the PostgreSQL claim statements (jobqueue/sql/postgresql.sql, job_claim_available,
  job_claim_available_routed and job_claim_by_id): SQL written whole, whose locking SELECTs
  (each source of the routed one), routing, gate and answer order
  tests/integration/core/test_claim_rule.py compares, clause by clause, with what the ORM
  compiles from these conditions. A condition added here fails that test until the
  statements say it too.

Every time is the database's (Now()).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from django.db.models import BooleanField, ExpressionWrapper, Q
from django.db.models.functions import Now

from jobqueue import states

# Claim order: highest priority first, then the earliest claim_at (a plain job's available_at:
# the longest available; a fair job's fair_at: its key's virtual time, lifecycle/fairness.py),
# then the oldest. claim_at is an alias a queryset is given by `in_claim_order`.
ORDER = ("-priority", "claim_at", "created_at")


def claim_at(prefix: str = ""):
    """The claim order's second term, on a job (or `prefix`: a relation to one)."""
    from django.db.models.functions import Coalesce

    return Coalesce(f"{prefix}fair_at", f"{prefix}available_at")


@dataclass(frozen=True)
class Condition:
    """One condition of the rule: its name, and its filter (built when asked: Now() is an
    expression of the query it goes into)."""

    name: str
    q: Callable[[], Q]
    doc: str


JOB_CONDITIONS: tuple[Condition, ...] = (
    Condition("queued", lambda: Q(status=states.QUEUED),
              "the job is queued (not pending, running or finished)"),
    Condition("available", lambda: Q(available_at__lte=Now()),
              "its available_at has come (a retry's backoff, a release's retry_after)"),
    Condition("not_expired", lambda: Q(expires_at__isnull=True) | Q(expires_at__gt=Now()),
              "its expires_at, if any, has not passed (the reaper ends it expired)"),
    Condition("concurrency_slot", lambda: Q(concurrency_held__isnull=True),
              "its concurrency key, if any, has a slot for it (fewer than its limit of the "
              "key's jobs in progress or holding a slot: concurrency_held is cleared when a "
              "slot is given to it, jobqueue/sql/postgresql.sql jobqueue_concurrency_admit)"),
    Condition("rate_permit", lambda: Q(rate_held__isnull=True),
              "its rate limit key, if any, has a permit for it (fewer than the key's count of "
              "its jobs claimed in the window or holding a permit: rate_held is cleared when a "
              "permit is given to it, migration 0029 jobqueue_rate_admit)"),
)

# On the job's agent (job_agent), not the job: a paused agent's claims hand out nothing.
AGENT_CONDITIONS: tuple[Condition, ...] = (
    Condition("agent_not_paused", lambda: Q(paused_at__isnull=True),
              "the agent is not paused"),
)


def matches(agent_labels, job_labels) -> bool:
    """Does an agent with `agent_labels` match a job (or label set) with `job_labels`? When
    it has every one of them (PostgreSQL's statements say `agent.labels @> set.labels`)."""
    return set(job_labels) <= set(agent_labels)


def own_jobs(job_agent_id) -> Q:
    """The jobs that target this agent by name (not the labelled jobs it claimed last)."""
    return Q(job_agent_id=job_agent_id, label_set__isnull=True)


def labelled_jobs(label_set_ids) -> Q:
    """The labelled jobs that target these label sets."""
    return Q(label_set_id__in=list(label_set_ids))


def label_sets_for(job_agent) -> list[int]:
    """The label sets of the agent's workspace that its labels include (`matches`): none,
    without a query, for an agent without labels. PostgreSQL finds them through their GIN
    index (label_sets_within: the sets it does not match are not read); SQLite reads the
    workspace's sets and keeps those `matches` lets through."""
    from django.db import connection

    from jobqueue.models import JobLabelSet

    if not job_agent.labels:
        return []
    if connection.vendor == "postgresql":
        from jobqueue.sql import postgresql

        with connection.cursor() as cur:
            cur.execute(postgresql.label_sets_within, {
                "workspace": job_agent.workspace_id, "labels": json.dumps(job_agent.labels)})
            return [row[0] for row in cur.fetchall()]
    return [set_id for set_id, labels in JobLabelSet.objects.filter(
        workspace_id=job_agent.workspace_id).values_list("id", "labels")
        if matches(job_agent.labels, labels)]


def routed_to(job_agent) -> Q:
    """The jobs a claim of this agent considers: its own and the labelled jobs it matches."""
    sets = label_sets_for(job_agent)
    return own_jobs(job_agent.id) | labelled_jobs(sets) if sets else own_jobs(job_agent.id)


def agents_matching(job):
    """The agents a job is routed to: its agent, or for a labelled job every agent of its
    workspace that matches its labels (a list, with their paused_at and last_seen_at)."""
    from jobqueue.models import JobAgent

    if job.label_set_id is None:
        return list(JobAgent.objects.filter(id=job.job_agent_id))
    return [agent for agent in JobAgent.objects.filter(workspace_id=job.workspace_id)
            if matches(agent.labels, job.labels)]


def claimable() -> Q:
    """The job conditions, together."""
    q = Q()
    for condition in JOB_CONDITIONS:
        q &= condition.q()
    return q


def agent_may_claim() -> Q:
    """The agent conditions, on job_agent rows."""
    q = Q()
    for condition in AGENT_CONDITIONS:
        q &= condition.q()
    return q


def agents_with_claimable_jobs(agent_ids: Iterable) -> list:
    """Which of these agents would a claim hand a job to now: the wake-up hub's re-check.
    One query for their own jobs; for agents with labels, their label sets (a query each)
    and which of those have a claimable job (one query: a probe of
    job_label_claim_order_idx a set)."""
    from django.db.models import Exists, OuterRef

    from jobqueue.models import Job, JobAgent, JobLabelSet

    agent_ids = list(agent_ids)
    # One probe of job_claim_order_idx an agent (EXISTS stops at the first job), not every
    # claimable job of the agents read and made DISTINCT.
    ready = set(JobAgent.objects.filter(agent_may_claim(), id__in=agent_ids)
                .filter(Exists(Job.objects.filter(claimable(), job_agent_id=OuterRef("id"),
                                                  label_set__isnull=True)))
                .values_list("id", flat=True))
    labelled = [a for a in JobAgent.objects.filter(agent_may_claim(), id__in=agent_ids)
                .only("id", "workspace_id", "labels") if a.labels and a.id not in ready]
    sets = {a.id: label_sets_for(a) for a in labelled}
    if any(sets.values()):
        live = set(JobLabelSet.objects.filter(
            id__in={s for found in sets.values() for s in found}
        ).filter(Exists(Job.objects.filter(claimable(), label_set_id=OuterRef("id"))))
            .values_list("id", flat=True))
        ready.update(agent for agent, found in sets.items() if live.intersection(found))
    return list(ready)


@dataclass(frozen=True)
class Verdict:
    """What the rule says of one job now (`verdict`)."""

    job: Any  # the Job (its bulky columns deferred), with each job condition as an attribute
    job_unmet: list[str]  # the job conditions it does not meet, in the rule's order
    # The agents it is routed to (`agents_matching`), each with each agent condition (and
    # what the caller asked to annotate) as an attribute.
    agents: list
    # The agent conditions not met: none when some agent of `agents` meets them all, else
    # those of the agent closest to it (fewest unmet); all of them when `agents` is empty.
    agent_unmet: list[str]

    @property
    def unmet(self) -> list[str]:
        return self.job_unmet + self.agent_unmet


def verdict(job_id, *, workspace_id=None, annotate_agents: dict | None = None) -> Verdict | None:
    """The conditions of the rule the job meets and does not meet now, on the database's
    clock (None when there is no such job, in `workspace_id` when given). The agent
    conditions are asked of every agent the job is routed to: its agent, or for a labelled
    job each agent of its workspace that matches its labels; they are met when one agent
    meets them all. Three queries: the job, its agents (`agents_matching`), their
    conditions (with `annotate_agents`, expressions the caller wants of each agent)."""
    from jobqueue.models import Job, JobAgent

    def checks(conditions):
        return {c.name: ExpressionWrapper(c.q(), output_field=BooleanField())
                for c in conditions}

    jobs = Job.objects.filter(id=job_id)
    if workspace_id is not None:
        jobs = jobs.filter(workspace_id=workspace_id)
    job = (jobs.defer("dispatch_context", "job_agent_config", "result", "message")
           .annotate(**checks(JOB_CONDITIONS)).first())
    if job is None:
        return None
    agents = list(JobAgent.objects.filter(id__in=[a.id for a in agents_matching(job)])
                  .annotate(**checks(AGENT_CONDITIONS), **(annotate_agents or {}))
                  .order_by("name", "id"))
    agent_unmet = min(([c.name for c in AGENT_CONDITIONS if not getattr(agent, c.name)]
                       for agent in agents),
                      key=len, default=[c.name for c in AGENT_CONDITIONS])
    return Verdict(job, [c.name for c in JOB_CONDITIONS if not getattr(job, c.name)], agents,
                   agent_unmet)


def unmet(job_id) -> list[str] | None:
    """The names of the conditions the job does not meet now, in the rule's order (job
    conditions, then the agent conditions, asked of the agents it is routed to: `verdict`):
    [] when a claim of its agent, or of an agent matching its labels, would take it (unless a
    claim in flight holds it), None when there is no such job. On the database's clock."""
    found = verdict(job_id)
    return None if found is None else found.unmet
