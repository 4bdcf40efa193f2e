"""Shared pieces of the benchmark suite: databases, worker processes, statistics.

Worker processes speak a tiny protocol on stdin/stdout so that every system is timed the
same way: a worker sets itself up, prints `ready`, waits for a line on stdin, does its work,
and prints one JSON line `{"n": jobs, "t0": start, "t1": end, ...}` (wall-clock seconds).
Throughput of a run = sum(n) / (max(t1) - min(t0)).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PG_ADMIN_URL = os.environ.get("BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432/postgres")


def db_url(name: str) -> str:
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    return f"{base}/{name}"


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


def run_workers(commands: list[list[str]], env: dict | None = None, timeout: float = 900):
    """Start every command, wait until all are ready, release them at once, collect."""
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
