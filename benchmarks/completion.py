"""Completion benchmarks (issue 15), small by default, on PostgreSQL only:

  outbox    the core cycle (claim-next + terminal report, one process) without and with one
            webhook endpoint configured: the cost per job of the outbox row
  sender    webhook deliveries per second to a local receiver (one sender)
  prune     pruning finished jobs (rows/s) with prune_jobs in its own process, and claim-next +
            report latency before and while it runs

    TEST_DATABASE_URL=postgres://postgres@127.0.0.1:5432/jq_bench python -m benchmarks.completion

Uses (and drops afterwards) the database <prefix>_completion. Sizes: BENCH_OUTBOX_JOBS (1000
per rep), BENCH_OUTBOX_REPS (3), BENCH_PRUNE_JOBS (20000; `make bench` runs it with
1,000,000). Prints one JSON object. `make bench` runs it as its `completion` scenario.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import threading
import time

from benchmarks.common import ROOT, db_name, db_url, drop_database, recreate_database

NAME = db_name("completion")


def setup_django():
    os.environ["DATABASE_URL"] = db_url(NAME)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def make_jobs(agent, n, **fields):
    from jobqueue.models import Job

    jobs = [Job(workspace_id=agent.workspace_id, job_agent=agent, max_attempts=3,
                initial_max_attempts=3, **fields) for _ in range(n)]
    Job.objects.bulk_create(jobs, batch_size=2000)
    return jobs


def cycle(agent, n) -> float:
    """Seconds per job of claim-next + successful report, drained by one process."""
    from jobqueue import lifecycle, states

    make_jobs(agent, n)
    started = time.perf_counter()
    done = 0
    while True:
        grant = lifecycle.claim_next_job(agent)
        if grant is None:
            break
        lifecycle.report_status(grant.job.id, grant.claim_id, states.SUCCESSFUL)
        done += 1
    assert done == n
    return (time.perf_counter() - started) / n


def outbox(agent_plain, agent_hooked, n, reps) -> dict:
    plain, hooked = [], []
    for _ in range(reps):  # interleaved, so that both see the same machine
        plain.append(cycle(agent_plain, n))
        hooked.append(cycle(agent_hooked, n))
    p, h = statistics.median(plain), statistics.median(hooked)
    return {"jobs_per_rep": n, "reps": reps, "per_job_ms_without": round(p * 1000, 3),
            "per_job_ms_with_one_endpoint": round(h * 1000, 3),
            "outbox_cost_ms_per_job": round((h - p) * 1000, 3),
            "ratio": round(h / p, 3)}


def sender() -> dict:
    from jobqueue.maintenance import webhooks
    from jobqueue.models import WebhookDelivery
    from tests.webhook_receiver import Receiver

    receiver = Receiver()
    WebhookDelivery.objects.update(status="pending", attempts=0)
    from jobqueue.models import WebhookEndpoint

    WebhookEndpoint.objects.update(url=receiver.url)
    n = WebhookDelivery.objects.count()
    started = time.perf_counter()
    delivered = 0
    while True:
        counts = webhooks.run_once(limit=100)
        delivered += counts["delivered"]
        if not any(counts.values()):
            break
    elapsed = time.perf_counter() - started
    receiver.close()
    assert delivered == n == len(receiver.requests), (delivered, n, len(receiver.requests))
    return {"deliveries": n, "seconds": round(elapsed, 3),
            "deliveries_per_second": round(n / elapsed, 1)}


def columns(table: str, skip=()) -> str:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT column_name FROM information_schema.columns WHERE table_name = %s "
                    "ORDER BY ordinal_position", [table])
        return ", ".join(f'"{c}"' for (c,) in cur.fetchall() if c not in skip)


def cols_of(alias: str, cols: str) -> str:
    return ", ".join(f"{alias}.{c.strip()}" for c in cols.split(","))


def copy_rows(table: str, template_id, n: int) -> None:
    """n copies of one job row (new ids, no idempotency key), in one statement: the ORM would
    take minutes for a million."""
    from django.db import connection

    cols = columns(table, skip=("id", "idempotency_key"))
    with connection.cursor() as cur:
        cur.execute(f"INSERT INTO {table} (id, {cols}) SELECT gen_random_uuid(), "
                    f"{cols_of('t', cols)} FROM {table} t, generate_series(1, %s) "
                    "WHERE t.id = %s", [n, template_id])


def prune(agent, n) -> dict:
    from django.db import connection, connections

    from jobqueue import lifecycle, states
    from jobqueue.db import db_now
    from jobqueue.models import JobEvent

    old = db_now() - dt.timedelta(days=20)
    (template,) = make_jobs(agent, 1, status=states.SUCCESSFUL, attempt=1, completed_at=old)
    JobEvent.objects.create(job_id=template.id, kind=JobEvent.STATUS_REPORTED, attempt=1,
                            detail={})
    filled = time.perf_counter()
    copy_rows("job", template.id, n - 1)
    with connection.cursor() as cur:
        # One finished event per job, copied from the template's.
        cols = columns("job_event", skip=("id", "job_id"))
        cur.execute(f"INSERT INTO job_event (job_id, {cols}) SELECT j.id, {cols_of('e', cols)} "
                    "FROM job j, job_event e WHERE e.job_id = %s AND j.id <> %s "
                    "AND j.status = 'successful'", [template.id, template.id])
        cur.execute("VACUUM ANALYZE job")
        cur.execute("VACUUM ANALYZE job_event")
    fill_seconds = time.perf_counter() - filled

    def latencies(stop: threading.Event, out: list, limit: int | None = None):
        try:
            while not stop.is_set() and (limit is None or len(out) < limit):
                make_jobs(agent, 1)
                t = time.perf_counter()
                grant = lifecycle.claim_next_job(agent)
                lifecycle.report_status(grant.job.id, grant.claim_id, states.SUCCESSFUL)
                out.append(time.perf_counter() - t)
        finally:
            connections.close_all()

    before: list = []
    latencies(threading.Event(), before, limit=2000)  # as many as the p99s can compare
    during: list = []
    stop = threading.Event()
    t = threading.Thread(target=latencies, args=(stop, during))
    t.start()
    # The pruner in its own process, as deployed (run_maintenance, or prune_jobs from a
    # scheduler): a thread here would share this process's GIL with the measured cycle.
    started = time.perf_counter()
    out = subprocess.run([sys.executable, str(ROOT / "manage.py"), "prune_jobs", "--json"],
                         check=True, cwd=ROOT,
                         capture_output=True, text=True,
                         env={**os.environ, "DATABASE_URL": db_url(NAME)}).stdout
    elapsed = time.perf_counter() - started
    stop.set()
    t.join()
    result = json.loads(out)
    assert result["jobs"] >= n, result

    def ms(values, q):
        values = sorted(values)
        return round(values[min(len(values) - 1, int(q * len(values)))] * 1000, 3)

    return {"jobs": result["jobs"], "batches": result["batches"], "seconds": round(elapsed, 3),
            "fill_seconds": round(fill_seconds, 1),
            "rows_per_second": round(result["jobs"] / elapsed, 1),
            "cycle_ms_before": {"p50": ms(before, 0.5), "p99": ms(before, 0.99),
                                "n": len(before)},
            "cycle_ms_during": {"p50": ms(during, 0.5), "p99": ms(during, 0.99),
                                "n": len(during)}}


def main() -> None:
    recreate_database(NAME)
    try:
        setup_django()
        from jobqueue.maintenance import webhooks
        from tests.factories import JobAgentFactory

        plain, hooked = JobAgentFactory(), JobAgentFactory()
        webhooks.create_endpoint(hooked.workspace_id, "http://127.0.0.1:9/unused")
        out = {"outbox": outbox(plain, hooked, int(os.environ.get("BENCH_OUTBOX_JOBS", 1000)),
                                int(os.environ.get("BENCH_OUTBOX_REPS", 3)))}
        out["sender"] = sender()
        out["prune"] = prune(plain, int(os.environ.get("BENCH_PRUNE_JOBS", 20000)))
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
    finally:
        from django.db import connections

        connections.close_all()
        drop_database(NAME)


if __name__ == "__main__":
    main()
