"""Shared pieces of the benchmark suite: databases, worker processes, statistics.

Worker processes speak a tiny protocol on stdin/stdout so that every system is timed the
same way: a worker sets itself up (connection open, framework set up, its first poll about
to happen), prints `ready`, waits for a line on stdin, does its work, and prints one JSON
line `{"n": jobs, ...}`. A drain (`run_drain`) is timed on the database's clock: from the
moment every worker is ready (clock_timestamp() read just before the orchestrator says go)
to the last completion timestamp the system wrote. Other scenarios time themselves with the
workers' own `t0`/`t1` (`throughput`).

Databases: every database the suite creates is named after the one in BENCH_DATABASE_URL
(`make bench` passes TEST_DATABASE_URL): `jq_bench` gives `jq_bench_core`,
`jq_bench_pgbench`, `jq_bench_pgqueuer`, ... on the same server. The named database itself
is never touched.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASE_URL = os.environ.get("BENCH_DATABASE_URL") or os.environ.get(
    "TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/jq_bench"
)
SERVER_URL, PREFIX = BASE_URL.split("?", 1)[0].rsplit("/", 1)
if not re.fullmatch(r"[a-z_][a-z0-9_]{0,40}", PREFIX):
    raise SystemExit(f"BENCH_DATABASE_URL must name a database like jq_bench, not {PREFIX!r}")


def db_name(what: str) -> str:
    """The name of one of the suite's own databases (`<prefix>_<what>`)."""
    return f"{PREFIX}_{what}"


def db_url(name: str) -> str:
    return f"{SERVER_URL}/{name}"


def admin_conn(dbname: str = "postgres"):
    import psycopg

    return psycopg.connect(db_url(dbname), autocommit=True)


def recreate_database(name: str) -> None:
    with admin_conn() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def drop_database(name: str) -> None:
    with admin_conn() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --- the worker protocol ------------------------------------------------------------------


def worker_ready() -> None:
    """Called by a worker once set up; returns when the orchestrator says go."""
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    sys.stdin.readline()


def worker_done(**result) -> None:
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


def run_workers(commands: list[list[str]], env: dict | None = None, timeout: float = 900,
                before_go=None):
    """Start every command, wait until all are ready, call `before_go`, release them at once,
    collect their results."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(ROOT)
    full_env.update(env or {})
    procs = [
        subprocess.Popen(
            cmd, cwd=ROOT, env=full_env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )
        for cmd in commands
    ]
    try:
        for p in procs:
            line = p.stdout.readline()
            if line.strip() != "ready":
                err = p.stderr.read() if p.poll() is not None else ""
                raise RuntimeError(f"worker {p.args} did not start: {line!r} {err[-2000:]}")
        if before_go is not None:
            before_go()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        results = []
        deadline = time.monotonic() + timeout
        for p in procs:
            out, err = p.communicate(timeout=max(1, deadline - time.monotonic()))
            if p.returncode != 0:
                raise RuntimeError(f"worker {p.args} failed ({p.returncode}): {err[-3000:]}")
            results.append(json.loads(out.strip().splitlines()[-1]))
        return results
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def run_drain(commands, env: dict, database: str, last_done_at, timeout: float = 900):
    """Run one drain and time it on the database's clock: from just before `go` (every
    worker ready) to `last_done_at()`, the epoch of the last completion the system wrote,
    read after every worker exited. Returns (results, elapsed seconds)."""
    import psycopg

    with psycopg.connect(db_url(database), autocommit=True) as clock:
        start: list[float] = []

        def read_clock():
            start.append(float(clock.execute(
                "SELECT extract(epoch FROM clock_timestamp())").fetchone()[0]))

        results = run_workers(commands, env=env, timeout=timeout, before_go=read_clock)
    end = last_done_at()
    if not end or end < start[0]:
        raise RuntimeError(f"no completion recorded after the start ({end} < {start[0]})")
    return results, end - start[0]


def throughput(results: list[dict]) -> tuple[int, float, float]:
    n = sum(r["n"] for r in results)
    elapsed = max(r["t1"] for r in results) - min(r["t0"] for r in results)
    return n, elapsed, n / elapsed if elapsed > 0 else float("inf")


def percentile(values, p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def median(values) -> float:
    return statistics.median(values) if values else float("nan")


def log(msg: str) -> None:
    sys.stderr.write(f"[bench {time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stderr.flush()
