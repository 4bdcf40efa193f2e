"""The peers of the core-cycle benchmark, run with .venv-bench (requirements-bench.txt).

    python -m benchmarks.peers setup SYSTEM N CONFIG        # fresh schema + N no-op jobs
    python -m benchmarks.peers worker SYSTEM CONFIG K       # K consumers in this process
    python -m benchmarks.peers verify SYSTEM N              # prints {"done", "last_done_at"}
    python -m benchmarks.peers versions                     # prints the peers' versions

SYSTEM: pgqueuer | procrastinate | djtasks; CONFIG: a JSON object (see CONFIGS below).
DATABASE_URL names the (throwaway) database.

Every worker follows the protocol of benchmarks.common: it does all of its set-up first
(connections open, schema checked, worker registered, Django set up), then holds its
consumers at their first poll, prints `ready` and waits for `go`. A process running K
consumers says `ready` once all K stand at their first poll. The orchestrator reads the
database clock between the last `ready` and `go`; the drain ends at the last completion
timestamp the system itself writes (`verify`), not when a worker process exits.
`"gate": "start"` releases the worker before its set-up instead (the harness of round 1,
kept to measure what the set-up cost the old figures).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

from benchmarks.common import worker_done, worker_ready

URL = os.environ.get("DATABASE_URL", "")
# What each consumer process ran (a cross-check of the database's own count), and the set-up
# that round 1 timed as part of the drain: from where its harness released the worker to
# the first poll (seconds; reported by gated workers).
RAN = {"n": 0}
SETUP = {"from": 0.0, "seconds": None}


def setup_begins() -> None:
    SETUP["from"] = time.perf_counter()


def setup_ends() -> None:
    SETUP["seconds"] = time.perf_counter() - SETUP["from"]


def done() -> None:
    worker_done(n=RAN["n"], setup_s=SETUP["seconds"])

# The configuration each peer runs in in the core scenario, for c consumers in all (worker
# processes x consumers per process; `processes` is a number or "c", one per consumer).
# Each follows the peer's documentation; where it offers several, the `peers` scenario
# measures them (SWEEP below) and docs/performance.md, "How each peer runs", says why these.
CONFIGS = {
    # pgqueuer's documented driver (asyncpg, one connection per QueueManager), on uvloop as
    # its `pgq run` CLI runs it, its own `pgq autovac` table settings applied after install.
    "pgqueuer_b10": {"system": "pgqueuer", "driver": "asyncpg", "loop": "uvloop",
                     "batch": 10, "processes": "c"},
    "pgqueuer_b1": {"system": "pgqueuer", "driver": "asyncpg", "loop": "uvloop",
                    "batch": 1, "processes": "c"},
    # An async no-op task, so that the worker runs it on its event loop (a sync task goes
    # through a thread per job); one worker process per consumer.
    "procrastinate": {"system": "procrastinate", "task": "async", "processes": "c"},
    # One `db_worker --batch` process per consumer, with persistent database connections
    # (CONN_MAX_AGE=None): Django's default of 0 reconnects on every loop iteration.
    "djtasks": {"system": "djtasks", "conn_max_age": None, "processes": "c"},
}

# The configurations the `peers` scenario compares (label -> config). "round 1" is the
# configuration and harness the round-1 figures came from.
SWEEP = {
    "pgqueuer": {
        "b10, psycopg, asyncio, released before set-up (round 1)":
            {"driver": "psycopg", "loop": "asyncio", "batch": 10, "processes": "c",
             "gate": "start"},
        "b10, psycopg, asyncio": {"driver": "psycopg", "loop": "asyncio", "batch": 10,
                                  "processes": "c"},
        "b10, asyncpg, asyncio": {"driver": "asyncpg", "loop": "asyncio", "batch": 10,
                                  "processes": "c"},
        "b10, asyncpg, uvloop": {"driver": "asyncpg", "loop": "uvloop", "batch": 10,
                                 "processes": "c"},
        "b10, asyncpg, uvloop, one process": {"driver": "asyncpg", "loop": "uvloop",
                                              "batch": 10, "processes": 1},
        "b10, asyncpg, uvloop, two processes": {"driver": "asyncpg", "loop": "uvloop",
                                                "batch": 10, "processes": 2},
        "b1, psycopg, asyncio, released before set-up (round 1)":
            {"driver": "psycopg", "loop": "asyncio", "batch": 1, "processes": "c",
             "gate": "start"},
        "b1, asyncpg, uvloop": {"driver": "asyncpg", "loop": "uvloop", "batch": 1,
                                "processes": "c"},
        "b1, asyncpg, uvloop, one process": {"driver": "asyncpg", "loop": "uvloop",
                                             "batch": 1, "processes": 1},
        "b25, asyncpg, uvloop": {"driver": "asyncpg", "loop": "uvloop", "batch": 25,
                                 "processes": "c"},
        "b100, asyncpg, uvloop": {"driver": "asyncpg", "loop": "uvloop", "batch": 100,
                                  "processes": "c"},
    },
    "procrastinate": {
        "sync task, released before set-up (round 1)":
            {"task": "sync", "processes": "c", "gate": "start"},
        "sync task": {"task": "sync", "processes": "c"},
        "async task": {"task": "async", "processes": "c"},
        "async task, one process (concurrency=c)": {"task": "async", "processes": 1},
        "async task, two processes": {"task": "async", "processes": 2},
    },
    "djtasks": {
        "CONN_MAX_AGE=0, released before set-up (round 1)":
            {"conn_max_age": 0, "processes": "c", "gate": "start"},
        "CONN_MAX_AGE=0 (Django's default)": {"conn_max_age": 0, "processes": "c"},
        "CONN_MAX_AGE=None (persistent)": {"conn_max_age": None, "processes": "c"},
    },
}


def split(config: dict, c: int) -> list[int]:
    """Consumers per worker process for c consumers in all."""
    procs = c if config.get("processes", "c") == "c" else min(c, int(config["processes"]))
    return [c // procs + (1 if i < c % procs else 0) for i in range(procs)]


class Gate:
    """Holds this process's consumers at their first poll until the orchestrator says go."""

    def __init__(self, consumers: int, enabled: bool = True):
        self.waiting = consumers
        self.open = asyncio.Event()
        if not enabled:  # released before its set-up (round 1): nothing to hold
            self.open.set()

    async def pass_(self) -> None:
        if self.open.is_set():
            return
        self.waiting -= 1
        if self.waiting > 0:
            await self.open.wait()
            return
        setup_ends()
        await asyncio.to_thread(worker_ready)
        self.open.set()

    def wrap(self, fn):
        async def gated(*args, **kwargs):
            if not self.open.is_set():
                await self.pass_()
            return await fn(*args, **kwargs)

        return gated


def _run(coro, loop: str = "asyncio"):
    if loop == "uvloop":
        import uvloop

        return uvloop.run(coro)
    return asyncio.run(coro)


def _psql(query: str):
    import psycopg

    with psycopg.connect(URL) as conn:
        return conn.execute(query).fetchone()


# --- pgqueuer -----------------------------------------------------------------------------


async def _pgq_driver(driver: str):
    if driver == "asyncpg":
        import asyncpg
        from pgqueuer.db import AsyncpgDriver

        return AsyncpgDriver(await asyncpg.connect(URL))
    import psycopg
    from pgqueuer.db import PsycopgDriver

    return PsycopgDriver(await psycopg.AsyncConnection.connect(URL, autocommit=True))


def pgqueuer_setup(n: int, config: dict) -> None:
    from pgqueuer import Queries

    async def go():
        q = Queries(await _pgq_driver("asyncpg"))
        await q.install()
        await q.optimize_autovacuum()  # `pgq autovac`, its documented post-install step
        for start in range(0, n, 1000):
            k = min(n, start + 1000) - start
            await q.enqueue(["noop"] * k, [None] * k, [0] * k)

    _run(go())


def pgqueuer_worker(config: dict, consumers: int) -> None:
    import logging
    from datetime import timedelta

    logging.disable(logging.CRITICAL)
    gate_at_start = config.get("gate") == "start"

    async def go():
        from pgqueuer import Queries, QueueManager
        from pgqueuer.types import QueueExecutionMode

        gate = Gate(consumers, enabled=not gate_at_start)
        managers = []
        for _ in range(consumers):
            queries = Queries(await _pgq_driver(config["driver"]))
            queries.dequeue = gate.wrap(queries.dequeue)
            qm = QueueManager(queries)

            @qm.entrypoint("noop")
            async def noop(job):
                RAN["n"] += 1

            managers.append(qm)
        if gate_at_start:  # round 1: connected, then released before the manager's set-up
            await asyncio.to_thread(worker_ready)
        setup_begins()
        await asyncio.gather(*(
            qm.run(batch_size=int(config["batch"]), mode=QueueExecutionMode.drain,
                   dequeue_timeout=timedelta(seconds=1),
                   log_aggregation_interval=timedelta(0))
            for qm in managers
        ))
        done()

    _run(go(), config["loop"])


def pgqueuer_verify(n: int) -> dict:
    """Queue empty; each job picked once and logged successful once (pgqueuer_log)."""
    left = _psql("SELECT count(*) FROM pgqueuer")[0]
    picked, ok, jobs, last = _psql(
        "SELECT count(*) FILTER (WHERE status = 'picked'), "
        "count(*) FILTER (WHERE status = 'successful'), "
        "count(DISTINCT job_id) FILTER (WHERE status = 'successful'), "
        "extract(epoch FROM max(created) FILTER (WHERE status = 'successful')) "
        "FROM pgqueuer_log"
    )
    problems = [f"{left} jobs left in the queue"] if left else []
    if not picked == ok == jobs == n:
        problems.append(f"{picked} picks, {ok} successes of {jobs} jobs for {n}")
    return {"done": jobs, "last_done_at": float(last or 0), "problems": problems}


# --- procrastinate ------------------------------------------------------------------------


def _procrastinate_app(kind: str = "async"):
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=URL))
    if kind == "async":
        @app.task(name="noop", queue="bench")
        async def noop(i):
            RAN["n"] += 1
    else:
        @app.task(name="noop", queue="bench")
        def noop(i):
            RAN["n"] += 1

    return app, noop


def procrastinate_setup(n: int, config: dict) -> None:
    app, noop = _procrastinate_app(config.get("task", "async"))
    with app.open():
        app.schema_manager.apply_schema()
        for start in range(0, n, 1000):
            noop.batch_defer(*({"i": i} for i in range(start, min(n, start + 1000))))


def procrastinate_worker(config: dict, consumers: int) -> None:
    import logging

    logging.disable(logging.CRITICAL)
    app, _ = _procrastinate_app(config.get("task", "async"))
    gate_at_start = config.get("gate") == "start"

    async def go():
        if gate_at_start:
            await asyncio.to_thread(worker_ready)
        setup_begins()
        # One fetch loop per worker whatever its concurrency: one gate pass opens it.
        gate = Gate(1, enabled=not gate_at_start)
        app.job_manager.fetch_job = gate.wrap(app.job_manager.fetch_job)
        async with app.open_async():
            await app.run_worker_async(queues=["bench"], concurrency=consumers, wait=False,
                                       install_signal_handlers=False, listen_notify=False)
        done()

    _run(go())


def procrastinate_verify(n: int) -> dict:
    """Every job succeeded, with one `started` and one `succeeded` event each."""
    succeeded, other = _psql(
        "SELECT count(*) FILTER (WHERE status = 'succeeded'), "
        "count(*) FILTER (WHERE status <> 'succeeded') FROM procrastinate_jobs"
    )
    started, ok, jobs, last = _psql(
        "SELECT count(*) FILTER (WHERE type = 'started'), "
        "count(*) FILTER (WHERE type = 'succeeded'), "
        "count(DISTINCT job_id) FILTER (WHERE type = 'succeeded'), "
        "extract(epoch FROM max(at) FILTER (WHERE type = 'succeeded')) "
        "FROM procrastinate_events"
    )
    problems = []
    if other or succeeded != n:
        problems.append(f"{succeeded} jobs succeeded and {other} did not, expected {n}")
    if not started == ok == jobs == n:
        problems.append(f"{started} starts, {ok} successes of {jobs} jobs for {n}")
    return {"done": jobs, "last_done_at": float(last or 0), "problems": problems}


# --- django-tasks-db ----------------------------------------------------------------------


def _djtasks(config: dict | None = None):
    if config is not None:
        os.environ["BENCH_DJTASKS_CONN_MAX_AGE"] = json.dumps(config.get("conn_max_age", 0))
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.peer_djtasks_settings"
    import django

    django.setup()


def djtasks_setup(n: int, config: dict) -> None:
    _djtasks(config)
    from django.core.management import call_command

    from benchmarks.peer_djtasks_tasks import noop

    call_command("migrate", verbosity=0)
    for i in range(n):
        noop.enqueue(i)


def djtasks_worker(config: dict, consumers: int) -> None:
    """`manage.py db_worker --batch`: one consumer per process (the worker is synchronous)."""
    if consumers != 1:
        raise SystemExit("django-tasks-db runs one task at a time per worker process")
    _djtasks(config)
    import logging

    from django.core.management import call_command
    from django.db import connection
    from django_tasks_db.models import DBTaskResultQuerySet

    from benchmarks.peer_djtasks_tasks import LAST

    logging.disable(logging.CRITICAL)
    if config.get("gate") == "start":
        worker_ready()
    else:
        setup_begins()
        connection.ensure_connection()
        get_locked = DBTaskResultQuerySet.get_locked
        opened = []

        def gated(self):
            if not opened:
                setup_ends()
                worker_ready()
                opened.append(True)
            return get_locked(self)

        DBTaskResultQuerySet.get_locked = gated
    call_command("db_worker", "--batch", "--no-startup-delay", "--interval", "0.05",
                 "--no-reload", verbosity=0)
    RAN["n"] = LAST["n"]
    done()


def djtasks_verify(n: int) -> dict:
    """Every task successful, each claimed by exactly one worker (worker_ids)."""
    _djtasks()
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FILTER (WHERE status = 'SUCCESSFUL'), "
            "count(*) FILTER (WHERE status <> 'SUCCESSFUL'), "
            "count(*) FILTER (WHERE jsonb_array_length(worker_ids::jsonb) <> 1), "
            "extract(epoch FROM max(finished_at)) FROM django_tasks_database_dbtaskresult"
        )
        ok, other, reclaimed, last = cur.fetchone()
    problems = []
    if ok != n or other:
        problems.append(f"{ok} tasks successful and {other} not, expected {n}")
    if reclaimed:
        problems.append(f"{reclaimed} tasks claimed more than once")
    return {"done": ok, "last_done_at": float(last or 0), "problems": problems}


def versions() -> dict:
    from importlib.metadata import version

    names = ["pgqueuer", "asyncpg", "uvloop", "procrastinate", "psycopg", "psycopg-pool",
             "django-tasks-db", "django-tasks", "Django"]
    return {name: version(name) for name in names}


SYSTEMS = {
    "procrastinate": (procrastinate_setup, procrastinate_worker, procrastinate_verify),
    "pgqueuer": (pgqueuer_setup, pgqueuer_worker, pgqueuer_verify),
    "djtasks": (djtasks_setup, djtasks_worker, djtasks_verify),
}

if __name__ == "__main__":
    action, *rest = sys.argv[1:]
    if action == "versions":
        print(json.dumps(versions()))
        sys.exit()
    system, *rest = rest
    setup, worker, verify = SYSTEMS[system]
    if action == "setup":
        setup(int(rest[0]), json.loads(rest[1]))
    elif action == "worker":
        worker(json.loads(rest[0]), int(rest[1]))
    elif action == "verify":
        out = verify(int(rest[0]))
        print(json.dumps(out))
        if out["problems"]:
            sys.exit(f"{system}: " + "; ".join(out["problems"]))
