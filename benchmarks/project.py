"""The project's database for the scenarios: created, migrated, set up for Django in this
process; jobs inserted straight in SQL and drains verified through the models.

The database is `<BENCH_DATABASE_URL's name>_core` (benchmarks.common), re-created each run.
Worker processes run with the app's virtualenv (APP_PY), the peers with .venv-bench
(BENCH_PY).
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid

from benchmarks.common import ROOT, db_name, db_url, log, recreate_database

DB = db_name("core")
APP_PY = str(ROOT / ".venv" / "bin" / "python")
BENCH_PY = str(ROOT / ".venv-bench" / "bin" / "python")


def retry(fn, what, attempts=3):
    """Run one measurement again (from scratch) when the database went away under it: the
    PostgreSQL of a shared machine may be restarted by someone else's test."""
    from django.db import connections

    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - logged, retried, re-raised at the end
            if attempt == attempts:
                raise
            log(f"{what}: {type(exc).__name__}: {str(exc)[:200]}; retrying")
            connections.close_all()
            time.sleep(10)


def setup_django():
    os.environ["DATABASE_URL"] = db_url(DB)
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.bench_settings"
    import django

    django.setup()


def migrate():
    recreate_database(DB)
    subprocess.run([APP_PY, "manage.py", "migrate", "-v0"], cwd=ROOT, check=True,
                   env={**os.environ, "DATABASE_URL": db_url(DB)})


def sql(statement, params=None, fetch=False):
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(statement, params or [])
        return cur.fetchall() if fetch else None


def reset_tables():
    from django.db import connections

    # CASCADE: every table that hangs off a job (outbox, logs, artifacts, checkpoints) too.
    sql("TRUNCATE job_event, job_claim, job, reaper_run CASCADE")
    sql("VACUUM ANALYZE job")
    connections.close_all()


def make_agent(lease_seconds=60, max_attempts=3, name=None):
    from jobqueue.models import JobAgent, Workspace

    ws = Workspace.objects.create(name=f"bench-{uuid.uuid4().hex[:6]}")
    return JobAgent.objects.create(workspace=ws, name=name or "bench-agent",
                                   lease_seconds=lease_seconds, max_attempts=max_attempts)


def insert_jobs(agent, n, status="queued"):
    """n jobs straight in SQL (setup only; no lifecycle events), in chunks."""
    done = "now()" if status in ("successful", "failure", "cancelled", "expired") else "NULL"
    step = 200_000
    for start in range(0, n, step):
        k = min(n, start + step) - start
        sql(
            "INSERT INTO job (id, workspace_id, job_agent_id, status, job_agent_config, "
            "dispatch_context, message, external_id, attempt, max_attempts, "
            "initial_max_attempts, priority, available_at, idempotency_fingerprint, created_at, "
            f"updated_at, completed_at) SELECT gen_random_uuid(), %s, %s, %s, '{{}}', '{{}}', '', "
            "'', 0, 3, 3, 0, now() - interval '1 second', '', now() - interval '1 second', "
            f"now(), {done} FROM generate_series(1, %s)",
            [agent.workspace_id, agent.id, status, k],
        )


def count_by_status(agent):
    from jobqueue.models import Job

    rows = Job.objects.filter(job_agent=agent).values_list("status").order_by()
    out: dict = {}
    for (s,) in rows.iterator():
        out[s] = out.get(s, 0) + 1
    return out


def report_counts(jobs) -> tuple[int, int]:
    """(the `status_reported` events on the timelines of `jobs`, the jobs they are on): the
    stored ones and the agents' final reports read from the job rows (jobqueue/timeline.py:
    a finished job whose last claim no stored event ended), in two queries."""
    from django.db.models import Exists, OuterRef

    from jobqueue import states
    from jobqueue.models import JobEvent
    from jobqueue.timeline import ENDINGS

    stored = JobEvent.objects.filter(job__in=jobs, kind="status_reported")
    derived = set(jobs.filter(status__in=states.TERMINAL, last_claim_id__isnull=False).exclude(
        Exists(JobEvent.objects.filter(job_id=OuterRef("id"), claim_id=OuterRef("last_claim_id"),
                                       kind__in=ENDINGS))).values_list("id", flat=True))
    on = set(stored.values_list("job_id", flat=True)) | derived
    return stored.count() + len(derived), len(on)


def claim_counts(jobs) -> int:
    """The `claimed` events on the timelines of `jobs`: the stored ones and the latest claims'
    read from the job rows (jobqueue/timeline.py: a job with its claim columns whose last
    claim no stored `claimed` names), in two queries."""
    from django.db.models import Exists, OuterRef

    from jobqueue.models import JobEvent

    stored = JobEvent.objects.filter(job__in=jobs, kind="claimed").count()
    derived = jobs.filter(last_claim_id__isnull=False, claim_lease_seconds__isnull=False).exclude(
        Exists(JobEvent.objects.filter(job_id=OuterRef("id"), claim_id=OuterRef("last_claim_id"),
                                       kind="claimed"))).count()
    return stored + derived


def verify_drained(agent, n):
    """Every job terminal exactly once: n successful, no claim left, one report event each."""
    from django.db.models import Count

    from jobqueue.models import Job, JobClaim

    statuses = dict(
        Job.objects.filter(job_agent=agent).values_list("status").order_by("status")
        .annotate(n=Count("id"))
    )
    reported = report_counts(Job.objects.filter(job_agent=agent))
    problems = []
    if statuses != {"successful": n}:
        problems.append(f"statuses {statuses}, expected {{'successful': {n}}}")
    if JobClaim.objects.filter(job_agent=agent).exists():
        problems.append("claims left")
    if reported != (n, n):
        problems.append(f"{reported[0]} status events on {reported[1]} of {n} jobs")
    claimed = claim_counts(Job.objects.filter(job_agent=agent))
    if claimed != n:
        problems.append(f"{claimed} claims for {n} jobs (each should be claimed once)")
    if problems:
        raise SystemExit("verification failed: " + "; ".join(problems))
