"""The claim rule: which job a claim may take, and in which order. Its one definition.

A claim takes a job of its agent that meets every condition of JOB_CONDITIONS, while the agent
meets every condition of AGENT_CONDITIONS, in ORDER (highest priority first, then the longest
available, then the oldest), skipping rows another claimer holds. Each condition has a name:
what a reader that asks "why is this job not being claimed?" reports when it does not hold
(`unmet()`).

Everything that decides claimability derives from here or is held to it by a test:

- the portable ORM claim (jobqueue/lifecycle/orm.py, claim_candidates: `claimable()` in
  `ORDER`, select_for_update(skip_locked=True) in transaction.atomic()), which SQLite runs;
- `Job.objects.claimable()` and `.in_claim_order()` (jobqueue/models.py), which call this;
- the wake-up hub's re-check (jobqueue/wakeups.py: `agents_with_claimable_jobs`);
- the PostgreSQL claim statements (jobqueue/sql/postgresql.sql, job_claim_available and
  job_claim_by_id): SQL written whole, whose locking SELECT, gate and answer order
  tests/integration/core/test_claim_rule.py compares, clause by clause, with what the ORM
  compiles from these conditions. A condition added here fails that test until the
  statements say it too.

Every time is the database's (Now()).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from django.db.models import BooleanField, ExpressionWrapper, Q
from django.db.models.functions import Now

from jobqueue import states

ORDER = ("-priority", "available_at", "created_at")


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
)

# On the job's agent (job_agent), not the job: a paused agent's claims hand out nothing.
AGENT_CONDITIONS: tuple[Condition, ...] = (
    Condition("agent_not_paused", lambda: Q(paused_at__isnull=True),
              "the agent is not paused"),
)


def claimable() -> Q:
    """The job conditions, together."""
    q = Q()
    for condition in JOB_CONDITIONS:
        q &= condition.q()
    return q


def _on_job(q: Q, prefix: str) -> Q:
    """An agent condition, written from the job's side (job_agent__...)."""
    return Q(*((_on_job(c, prefix) if isinstance(c, Q) else (f"{prefix}{c[0]}", c[1]))
               for c in q.children), _connector=q.connector, _negated=q.negated)


def agent_may_claim() -> Q:
    """The agent conditions, on job_agent rows."""
    q = Q()
    for condition in AGENT_CONDITIONS:
        q &= condition.q()
    return q


def jobs_agent_may_claim() -> Q:
    """The agent conditions, from the job's side (for a query on jobs)."""
    return _on_job(agent_may_claim(), "job_agent__")


def agents_with_claimable_jobs(agent_ids: Iterable) -> list:
    """Which of these agents would a claim hand a job to now (one query): the wake-up hub's
    re-check."""
    from jobqueue.models import Job

    return list(Job.objects.filter(claimable(), jobs_agent_may_claim(),
                                   job_agent_id__in=list(agent_ids))
                .values_list("job_agent_id", flat=True).distinct())


def unmet(job_id) -> list[str] | None:
    """The names of the conditions the job does not meet now, in the rule's order (job
    conditions, then its agent's): [] when a claim of its agent would take it (unless a claim
    in flight holds it), None when there is no such job. One query, on the database's clock."""
    from jobqueue.models import Job

    checks = {c.name: ExpressionWrapper(c.q(), output_field=BooleanField())
              for c in JOB_CONDITIONS}
    checks.update({c.name: ExpressionWrapper(_on_job(c.q(), "job_agent__"),
                                             output_field=BooleanField())
                   for c in AGENT_CONDITIONS})
    row = Job.objects.filter(id=job_id).annotate(**checks).values(*checks).first()
    if row is None:
        return None
    return [name for name in checks if not row[name]]
