"""Every index on `job`, the reader it serves and that reader's measurement (#26: "each index
on `job` names the reader it serves and that reader's benchmark"; `make bench
BENCH_ARGS=readers`, docs/performance.md "Who reads each index on job").

An index costs every job's claim and report an entry per row version (the `wal` scenario
prints the bytes), so each one must earn it. READERS names, for each index PostgreSQL has on
`job`, the code path that reads it and that path's query, built with the same ORM calls as
the code (so a change of the code's query that stops using the index shows here).
tests/integration/core/test_job_indexes.py fails when an index has no entry here, or an
entry names an index that no longer exists.

The scenario fills `job` with BENCH_READERS_JOBS jobs of one agent (96 % successful, 2 %
failure, 1 % queued, 1 % in progress, 0.02 % expired; every 10th with an external id, an
idempotency key and one of 500 unique keys, every 20th in a group, every 50th queued one past
its expires_at; finished over the retention period and an hour more, as an hourly pruner finds
them) and a second agent's 200 (a tenth failed), ANALYZEs, then for each reader: the indexes
its plan reads (EXPLAIN), its latency over BENCH_READERS_SAMPLES runs (p50 and p99), and its
p50 and plan with the index dropped, in a transaction rolled back: what the index buys its
reader.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

RETENTION = 14 * 86400  # JOBQUEUE_RETENTION_DAYS' default


@dataclass(frozen=True)
class Reader:
    index: str
    reader: str
    query: Callable  # (Context) -> QuerySet
    also: tuple = ()  # indexes the same plan reads beside it (a BitmapOr's other arm)


@dataclass(frozen=True)
class Context:
    workspace_id: object
    agent_id: object  # the agent with most jobs
    small_agent_id: object  # the agent with few jobs
    job_id: object
    external_id: str
    idempotency_key: str
    group: str
    unique_key: str = "u-5"
    schedule_id: object = None  # a schedule's (the fill makes none: its jobs are the few)
    label_set_id: object = None  # the label set of the fill's labelled jobs
    concurrency_key: str = "tenant-7"  # a concurrency key (the fill makes none: its jobs are few)
    rate_limit_key: str = "api-7"  # a rate limit key (the fill makes none: its jobs are few)
    fairness_key: str = "tenant-3"  # a fairness key (the fill makes none: its jobs are few)


def _by_id(c):
    from jobqueue.models import Job

    return Job.objects.filter(id=c.job_id)  # jobs/{id}, every report's and claim's row lock


def _claim_next(c):
    from jobqueue.models import Job

    # lifecycle's claim order (job_claim_available) and the agent's queued poll
    return Job.objects.filter(job_agent_id=c.agent_id).claimable().in_claim_order()[:1]


def _labelled_claim(c):
    from jobqueue.models import Job

    # job_claim_available_routed's source for one label set, and the queued poll of an agent
    # with labels (claimrule.labelled_jobs)
    return Job.objects.filter(label_set_id=c.label_set_id).claimable().in_claim_order()[:1]


def _concurrency_held(c):
    from jobqueue import states
    from jobqueue.models import Job

    # migration 0027, jobqueue_concurrency_admit: a key's next held job, in claim order
    return Job.objects.filter(
        workspace_id=c.workspace_id, concurrency_key=c.concurrency_key,
        status=states.QUEUED, concurrency_held=True).in_claim_order()[:1]


def _concurrency_live(c):
    from jobqueue import states
    from jobqueue.models import Job

    # migration 0027, jobqueue_concurrency_admit: the key's slot holders, counted
    return Job.objects.filter(
        workspace_id=c.workspace_id, concurrency_key=c.concurrency_key,
        concurrency_held__isnull=True, status__in=[states.QUEUED, states.IN_PROGRESS]
    ).values_list("workspace_id")


def _rate_held(c):
    from jobqueue import states
    from jobqueue.models import Job

    # migration 0029, jobqueue_rate_admit: a key's next held jobs, in claim order
    return Job.objects.filter(
        workspace_id=c.workspace_id, rate_limit_key=c.rate_limit_key,
        status=states.QUEUED, rate_held=True).in_claim_order()[:1]


def _rate_window(c):
    from django.db.models.functions import Now

    from jobqueue.models import Job

    # migration 0029, jobqueue_rate_admit: the key's jobs claimed in the window, counted
    return Job.objects.filter(
        workspace_id=c.workspace_id, rate_limit_key=c.rate_limit_key,
        started_at__gt=Now()).values_list("workspace_id")


def _rate_permit(c):
    from jobqueue import states
    from jobqueue.models import Job

    # migration 0029, jobqueue_rate_admit: the key's queued jobs given a permit, counted
    return Job.objects.filter(
        workspace_id=c.workspace_id, rate_limit_key=c.rate_limit_key,
        rate_held__isnull=True, status=states.QUEUED).values_list("workspace_id")


def _fair_head(c, route):
    from django.db.models.functions import Now

    from jobqueue import states
    from jobqueue.models import Job

    # lifecycle/fairness.py, place: the route's virtual time, its first due fair job
    return Job.objects.filter(
        status=states.QUEUED, fairness_key__isnull=False, available_at__lte=Now(), **route
    ).order_by("fair_at").values_list("fair_at")[:1]


def _fair_key(c, route):
    from jobqueue import states
    from jobqueue.models import Job

    # lifecycle/fairness.py, place: its key's last queued job on the route
    return Job.objects.filter(
        status=states.QUEUED, fairness_key=c.fairness_key, **route
    ).order_by("-fair_at").values_list("fair_at")[:1]


def _own(c):
    return {"job_agent_id": c.agent_id, "label_set__isnull": True}


def _set(c):
    return {"label_set_id": c.label_set_id}


def _newest_first(c):
    from jobqueue.models import Job

    # agents/views/jobs.py list, agents.pagination.NewestFirst
    return Job.objects.filter(workspace_id=c.workspace_id).order_by("-created_at", "-id")[:50]


def _by_status(c):
    from jobqueue import states
    from jobqueue.models import Job

    return (Job.objects.filter(workspace_id=c.workspace_id, status=states.EXPIRED)
            .order_by("-created_at", "-id")[:50])


def _external_id(c):
    from django.db.models import Q

    from jobqueue.models import Job

    # jobqueue/admin/jobs.py get_search_results: an exact key or external id
    return Job.objects.filter(Q(idempotency_key=c.external_id) | Q(external_id=c.external_id),
                              workspace_id=c.workspace_id)


def _group_counts(c):
    from django.db.models import Count

    from jobqueue.models import Job

    # jobqueue/lifecycle/groups.py group_state
    return (Job.objects.filter(workspace_id=c.workspace_id, group=c.group).order_by()
            .values_list("status").annotate(n=Count("id")))


def _overdue(c):
    from jobqueue.models import Job

    # jobqueue/lifecycle/reap.py expire_overdue_jobs_once (without its row locks)
    return Job.objects.overdue().order_by().values_list("id", "workspace_id")[:500]


def _prunable(c):
    from jobqueue import states
    from jobqueue.lifecycle.prune import prunable

    # jobqueue/lifecycle/prune.py prune_finished_once (without its row locks)
    return prunable([states.SUCCESSFUL, states.CANCELLED], RETENTION).order_by().values_list(
        "id", "status")[:1000]


def _agent_finished(c):
    from jobqueue import states
    from jobqueue.lifecycle.records import agent_jobs

    # agents/views/job_agents.py poll with ?status=failure (and GET jobs?job_agent_id=)
    return agent_jobs(c.workspace_id, c.small_agent_id, states.FAILURE)


def _idempotent_create(c):
    from jobqueue.models import Job

    # jobqueue/lifecycle/create.py: a create retried with its Idempotency-Key finds its job
    return Job.objects.filter(workspace_id=c.workspace_id, idempotency_key=c.idempotency_key)


def _unique_create(c):
    from jobqueue.lifecycle.create import live_with_key
    from jobqueue.lifecycle.inputs import Uniqueness

    # jobqueue/lifecycle/create.py: a create with a unique_key finds the live job with it
    return live_with_key(c.workspace_id, Uniqueness(c.unique_key))[:1]


def _schedule_waiting(c):
    import uuid

    from jobqueue.lifecycle.schedules import waiting_jobs

    # jobqueue/lifecycle/schedules.py: a buffer_one schedule's fire looks for a waiting job
    return waiting_jobs(c.schedule_id or uuid.UUID(int=1))[:1]


READERS = (
    Reader("job_pkey", "a job by id: GET jobs/{id}, every claim-by-id, report and requeue",
           _by_id),
    Reader("job_claim_order_idx", "claim-next and an agent's poll of its queued jobs, in claim "
           "order", _claim_next),
    Reader("job_label_claim_order_idx", "the claim of an agent with labels (and its queued "
           "poll): one label set's queued jobs, in claim order", _labelled_claim),
    Reader("job_workspace_created_idx", "the producers' list, newest first (GET jobs)",
           _newest_first),
    Reader("job_workspace_status_idx", "the producers' list of one status (GET jobs?status=), "
           "a rare one", _by_status),
    Reader("job_workspace_status_idx", "an agent's poll of a finished status (GET "
           "job-agents/{id}/jobs?status=failure), GET jobs?job_agent_id= (migration 0036: "
           "job_agent_id has no index of its own)", _agent_finished),
    Reader("job_external_id_idx", "the admin's search by external id or idempotency key (a "
           "BitmapOr with `job_idempotency_key_unique`)", _external_id,
           also=("job_idempotency_key_unique",)),
    Reader("job_group_idx", "a group's counts (GET groups/{name}), its cancel", _group_counts),
    Reader("job_overdue_idx", "the reaper's sweep of jobs past expires_at before they ran",
           _overdue),
    Reader("job_finished_idx", "retention: prune_jobs' batches of jobs finished before the cutoff",
           _prunable),
    Reader("job_idempotency_key_unique", "a create retried with its Idempotency-Key (POST jobs)",
           _idempotent_create),
    Reader("job_unique_key_idx", "a create with a unique_key finds the live job with it (POST "
           "jobs)", _unique_create),
    Reader("job_concurrency_held_idx", "a concurrency key's next held job, given a freed slot "
           "(migration 0027's triggers)", _concurrency_held),
    Reader("job_concurrency_live_idx", "a concurrency key's slot holders, counted before a "
           "slot is given (migration 0027's triggers)", _concurrency_live),
    Reader("job_rate_held_idx", "a rate limit key's next held jobs, given its free permits "
           "(migration 0029's triggers)", _rate_held),
    Reader("job_rate_window_idx", "a rate limit key's jobs claimed in its window, counted "
           "before permits are given (migration 0029's triggers)", _rate_window),
    Reader("job_rate_permit_idx", "a rate limit key's queued jobs given a permit, counted "
           "before permits are given (migration 0029's triggers)", _rate_permit),
    Reader("job_fair_agent_idx", "a fair job's creation finds its agent's virtual time, its "
           "first due fair job (lifecycle/fairness.py)", lambda c: _fair_head(c, _own(c))),
    Reader("job_fair_agent_key_idx", "a fair job's creation finds its key's last queued job "
           "of its agent (lifecycle/fairness.py)", lambda c: _fair_key(c, _own(c))),
    Reader("job_fair_set_idx", "a labelled fair job's creation finds its label set's virtual "
           "time (lifecycle/fairness.py)", lambda c: _fair_head(c, _set(c))),
    Reader("job_fair_set_key_idx", "a labelled fair job's creation finds its key's last queued "
           "job of its label set (lifecycle/fairness.py)", lambda c: _fair_key(c, _set(c))),
    Reader("job_schedule_idx", "a buffer_one schedule's fire looks for its waiting job "
           "(maintenance's schedules service)", _schedule_waiting),
)


def indexes_in_plan(plan) -> set[str]:
    """The index names anywhere in an EXPLAIN (FORMAT JSON) plan."""
    found: set[str] = set()

    def walk(node):
        if isinstance(node, dict):
            if "Index Name" in node:
                found.add(node["Index Name"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(plan)
    return found


def plan_indexes(qs) -> set[str]:
    return indexes_in_plan(json.loads(qs.explain(format="json")))


def fill(n: int) -> Context:
    """The table the readers run against (see the module's docstring)."""
    from benchmarks.project import make_agent, sql
    from jobqueue.models import JobAgent, JobGroup

    big = make_agent(name="readers-big")
    small = JobAgent.objects.create(workspace_id=big.workspace_id, name="readers-small",
                                    lease_seconds=60, max_attempts=3)
    insert = (
        "INSERT INTO job (id, workspace_id, job_agent_id, status, job_agent_config, "
        "dispatch_context, message, external_id, group_name, idempotency_key, unique_key, "
        "attempt, "
        "max_attempts, initial_max_attempts, priority, available_at, expires_at, "
        "idempotency_fingerprint, created_at, updated_at, started_at, completed_at) "
        "SELECT gen_random_uuid(), %(ws)s, %(agent)s, s.status, '{}', '{}', '', "
        "CASE WHEN i %% 10 = 0 THEN %(tag)s || 'ext-' || i ELSE '' END, "
        "CASE WHEN i %% 20 = 0 THEN %(tag)s || 'g-' || (i / 2000) END, "
        "CASE WHEN i %% 10 = 5 THEN %(tag)s || 'key-' || i END, "
        "CASE WHEN i %% 10 = 5 THEN %(tag)s || 'u-' || (i %% 500) END, "
        "0, 3, 3, 0, now() - interval '1 hour', "
        "CASE WHEN s.status = 'queued' AND i %% 50 = 0 THEN now() - interval '1 minute' END, "
        "'', now() - make_interval(secs => %(n)s - i), now(), "
        "CASE WHEN s.status <> 'queued' THEN now() END, "
        "CASE WHEN s.status NOT IN ('queued', 'in_progress') "
        "     THEN now() - make_interval(secs => (%(n)s - i)::float8 / %(n)s * %(span)s) END "
        "FROM generate_series(1, %(n)s) i, LATERAL (SELECT CASE "
        "  WHEN i %% 100 = 1 THEN 'queued' WHEN i %% 100 = 2 THEN 'in_progress' "
        "  WHEN i %% 100 IN (3, 4) THEN 'failure' WHEN i %% 5000 = 5 THEN 'expired' "
        "  ELSE 'successful' END AS status) s"
    )
    # finished over the retention period and one pruner interval more: what a pruner that runs
    # hourly finds to delete (RETENTION below)
    span = RETENTION + 3600
    sql(insert, {"ws": big.workspace_id, "agent": big.id, "n": n, "tag": "", "span": span})
    sql(insert, {"ws": big.workspace_id, "agent": small.id, "n": 200, "tag": "small-",
                 "span": span})
    # the small agent's: a tenth failed, no queued or running jobs of its own
    sql("UPDATE job SET status = CASE WHEN random() < 0.1 THEN 'failure' ELSE 'successful' "
        "END, started_at = now(), completed_at = now() WHERE job_agent_id = %s", [small.id])
    sql("INSERT INTO job_group (workspace_id, name, created_at, cancelled_by, cancel_reason) "
        "SELECT DISTINCT workspace_id, group_name, now(), '', '' FROM job "
        "WHERE group_name IS NOT NULL")
    # labelled jobs: one queued job in a hundred more, waiting for a label set
    from jobqueue import lifecycle

    labelled = lifecycle.label_set(big.workspace_id, ["gpu"])
    sql("INSERT INTO job (id, workspace_id, labels, label_set_id, status, job_agent_config, "
        "dispatch_context, message, external_id, attempt, max_attempts, initial_max_attempts, "
        "priority, available_at, idempotency_fingerprint, created_at, updated_at) "
        "SELECT gen_random_uuid(), %s, '[\"gpu\"]', %s, 'queued', '{}', '{}', '', '', 0, 3, 3, "
        "0, now() - interval '1 hour', '', now(), now() FROM generate_series(1, %s)",
        [big.workspace_id, labelled.id, max(1, n // 100)])
    sql("ANALYZE job")
    ((job_id,),) = sql("SELECT id FROM job WHERE job_agent_id = %s LIMIT 1", [big.id],
                       fetch=True)
    assert JobGroup.objects.filter(name="g-1").exists()
    return Context(workspace_id=big.workspace_id, agent_id=big.id, small_agent_id=small.id,
                   job_id=job_id, external_id="ext-1000", idempotency_key="key-1005",
                   group="g-1", label_set_id=labelled.id)


def _time(r: Reader, ctx: Context, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        list(r.query(ctx))
        times.append((time.perf_counter() - t0) * 1000)
    return sorted(times)


def _without(r: Reader, ctx: Context, runs: int) -> tuple[set, float]:
    """The reader's plan and p50 with its index dropped, in a transaction rolled back."""
    from django.db import connection, transaction

    class Undo(Exception):
        pass

    found: list = []
    try:
        with transaction.atomic():
            with connection.cursor() as cur:
                cur.execute("SELECT 1 FROM pg_constraint WHERE conname = %s", [r.index])
                if cur.fetchone():  # the primary key, a unique constraint
                    cur.execute(f'ALTER TABLE job DROP CONSTRAINT "{r.index}" CASCADE')
                else:
                    cur.execute(f'DROP INDEX "{r.index}"')
            used = plan_indexes(r.query(ctx))
            found.append((used, statistics.median(_time(r, ctx, runs))))
            raise Undo
    except Undo:
        pass
    return found[0]


def measure(n: int, samples: int) -> dict:
    from benchmarks.project import reset_tables

    reset_tables()
    ctx = fill(n)
    rows = []
    for r in READERS:
        used = plan_indexes(r.query(ctx))
        list(r.query(ctx))  # warm
        times = _time(r, ctx, samples)
        without_plan, without_p50 = _without(r, ctx, max(3, samples // 20))
        rows.append({"index": r.index, "reader": r.reader, "uses_it": r.index in used,
                     "plan_indexes": sorted(used), "p50_ms": statistics.median(times),
                     "p99_ms": times[min(len(times) - 1, int(len(times) * 0.99))],
                     "without_plan_indexes": sorted(without_plan),
                     "without_p50_ms": without_p50})
    return {"jobs": n, "samples": samples, "readers": rows}


def table(res: dict) -> list[str]:
    lines = [f"`job` holds {res['jobs']:,} jobs of one agent and 200 of another "
             "(benchmarks/readers.py); each reader's query as the code builds it, whether its "
             f"plan reads the index, its latency in this process over {res['samples']} runs, "
             "and its latency with the index dropped (in a transaction rolled back).", "",
             "| index | its reader | the plan reads it | p50 | p99 | p50 without it |",
             "| --- | --- | --- | ---: | ---: | ---: |"]
    for row in res["readers"]:
        seen = "yes" if row["uses_it"] else "**no**: " + (", ".join(row["plan_indexes"])
                                                          or "a sequential scan")
        instead = ", ".join(row["without_plan_indexes"]) or "a sequential scan"
        lines.append(f"| `{row['index']}` | {row['reader']} | {seen} | "
                     f"{row['p50_ms']:.2f} ms | {row['p99_ms']:.2f} ms | "
                     f"{row['without_p50_ms']:.2f} ms ({instead}) |")
    return lines
