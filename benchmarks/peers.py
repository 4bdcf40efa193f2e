"""The peers of the core-cycle benchmark, run with .venv-bench (requirements-bench.txt).

    python -m benchmarks.peers setup SYSTEM N        # fresh schema + N no-op jobs
    python -m benchmarks.peers worker SYSTEM [BATCH]  # the worker protocol of common.py
    python -m benchmarks.peers verify SYSTEM N       # prints {"done": k}; fails unless k == N

SYSTEM: procrastinate | pgqueuer | djtasks. DATABASE_URL names the (throwaway) database.
Each drains no-op jobs with its own worker loop at its defaults (pgqueuer: BATCH jobs a
dequeue; procrastinate and django-tasks-db: one job at a time, one worker per process).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

from benchmarks.common import worker_done, worker_ready

URL = os.environ.get("DATABASE_URL", "")
# Each no-op job notes when it ran: a worker's end is its last job, not its shutdown (the
# peers' drain modes wait for a poll timeout before exiting).
LAST = {"n": 0, "t": 0.0}


# --- procrastinate ------------------------------------------------------------------------


def _procrastinate_app():
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=URL))

    @app.task(name="noop", queue="bench")
    def noop(i):
        LAST["n"] += 1
        LAST["t"] = time.time()

    return app, noop


def procrastinate_setup(n: int) -> None:
    app, noop = _procrastinate_app()
    with app.open():
        app.schema_manager.apply_schema()
        for start in range(0, n, 1000):
            noop.batch_defer(*({"i": i} for i in range(start, min(n, start + 1000))))


def procrastinate_worker(_batch=None) -> None:
    import logging

    logging.disable(logging.CRITICAL)
    app, _ = _procrastinate_app()
    worker_ready()
    t0 = time.time()
    app.run_worker(queues=["bench"], concurrency=1, wait=False, install_signal_handlers=False,
                   listen_notify=False)
    worker_done(n=LAST["n"], t0=t0, t1=LAST["t"] or time.time())


def procrastinate_done() -> int:
    import psycopg

    with psycopg.connect(URL) as conn:
        return conn.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
        ).fetchone()[0]


# --- pgqueuer -----------------------------------------------------------------------------


async def _pgq_driver():
    import psycopg
    from pgqueuer import PsycopgDriver

    conn = await psycopg.AsyncConnection.connect(URL, autocommit=True)
    return PsycopgDriver(conn)


def pgqueuer_setup(n: int) -> None:
    from pgqueuer import Queries

    async def go():
        q = Queries(await _pgq_driver())
        await q.install()
        for start in range(0, n, 1000):
            k = min(n, start + 1000) - start
            await q.enqueue(["noop"] * k, [None] * k, [0] * k)

    asyncio.run(go())


def pgqueuer_worker(batch="10") -> None:
    import logging
    from datetime import timedelta

    from pgqueuer import QueueManager
    from pgqueuer.types import QueueExecutionMode

    logging.disable(logging.CRITICAL)
    async def go():
        from pgqueuer import Queries

        qm = QueueManager(Queries(await _pgq_driver()))

        @qm.entrypoint("noop")
        async def noop(job):
            LAST["n"] += 1
            LAST["t"] = time.time()

        worker_ready()
        t0 = time.time()
        await qm.run(batch_size=int(batch), mode=QueueExecutionMode.drain,
                     dequeue_timeout=timedelta(seconds=1),
                     log_aggregation_interval=timedelta(0))
        worker_done(n=LAST["n"], t0=t0, t1=LAST["t"] or time.time())

    asyncio.run(go())


def pgqueuer_done() -> int:
    import psycopg

    with psycopg.connect(URL) as conn:
        left = conn.execute("SELECT count(*) FROM pgqueuer").fetchone()[0]
        if left:
            return -left
        rows = conn.execute(
            "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'"
        ).fetchone()[0]
        return rows


# --- django-tasks-db ----------------------------------------------------------------------


def _djtasks():
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.peer_djtasks_settings"
    import django

    django.setup()


def djtasks_setup(n: int) -> None:
    _djtasks()
    from django.core.management import call_command

    from benchmarks.peer_djtasks_tasks import noop

    call_command("migrate", verbosity=0)
    for i in range(n):
        noop.enqueue(i)


def djtasks_worker(_batch=None) -> None:
    _djtasks()
    import logging

    from django.core.management import call_command

    logging.disable(logging.CRITICAL)
    worker_ready()
    t0 = time.time()
    call_command("db_worker", "--batch", "--no-startup-delay", "--interval", "0.05",
                 "--no-reload", verbosity=0)
    from benchmarks.peer_djtasks_tasks import LAST as DONE

    worker_done(n=DONE["n"], t0=t0, t1=DONE["t"] or time.time())


def djtasks_done() -> int:
    _djtasks()
    from django_tasks_db.models import DBTaskResult

    return DBTaskResult.objects.filter(status="SUCCESSFUL").count()


SYSTEMS = {
    "procrastinate": (procrastinate_setup, procrastinate_worker, procrastinate_done),
    "pgqueuer": (pgqueuer_setup, pgqueuer_worker, pgqueuer_done),
    "djtasks": (djtasks_setup, djtasks_worker, djtasks_done),
}

if __name__ == "__main__":
    action, system, *rest = sys.argv[1:]
    setup, worker, done = SYSTEMS[system]
    if action == "setup":
        setup(int(rest[0]))
    elif action == "worker":
        worker(*rest)
    elif action == "verify":
        k = done()
        print(json.dumps({"done": k}))
        if k != int(rest[0]):
            sys.exit(f"{system}: {k} jobs done, expected {rest[0]}")
