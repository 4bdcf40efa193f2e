"""The benchmark suite: `make bench` (or `python -m benchmarks.run`).

Scenarios (each verifies its own outcome before it reports):
  core       drain no-op jobs at 1/4/16 worker processes: the project's lifecycle (per job and
             in batches) next to pgbench (the machine's limit), raw psycopg loops and the
             peers procrastinate, pgqueuer and django-tasks-db (from .venv-bench), each in
             its configuration of benchmarks.peers.CONFIGS
  peers      each peer in every configuration of benchmarks.peers.SWEEP (driver, event loop,
             batch size, processes vs in-process consumers, connection reuse), to choose
             and show the best; BENCH_PEERS_CONCURRENCY levels, BENCH_PEERS_REPS runs
  http       N agents (1/8/32) against gunicorn: claim-next, one heartbeat, a terminal report;
             next to a trivial authenticated DRF endpoint that runs one query
  heartbeat  thousands of live claims heartbeating (one by one and in batches); the job
             table's write counters; job_claim's share of HOT updates
  growth     claim-next latency with 10,000 vs 1,000,000 finished jobs; poll latency with
             10,000 queued jobs
  reaper     time to reap many expired claims at a few batch sizes
  pickup     long-poll: latency from POST jobs to the waiting agent holding the claim with
             1/100/1000 idle waiting agents, next to a polling agent (idle backoff up to
             5 s), and the database's transactions per second while they wait on an empty
             queue
  wal        what a job costs the database over the API (benchmarks/wal.py): WAL bytes and
             transactions a job on the single and the batch path, and where the bytes go
             (pg_waldump, per relation); BENCH_WAL_JOBS jobs a path
  readers    every index on `job`, the reader it serves (benchmarks/readers.py): whether the
             reader's plan reads it, and its latency, on BENCH_READERS_JOBS jobs
  pgbouncer  the core cycle (claim-next + report, one caller in-process) direct and through a
             real PgBouncer in transaction mode as docs/deploying.md configures it
             (benchmarks/pgbouncer.py): rates, the ratio (target >= 0.8x);
             BENCH_PGBOUNCER_JOBS jobs a run, BENCH_PGBOUNCER_ROUNDS interleaved rounds
  completion the outbox's cost per job (one webhook endpoint), the webhook sender's
             deliveries/s, and pruning BENCH_PRUNE_JOBS (1,000,000) finished jobs: jobs/s,
             and another agent's cycle latency before and while it runs
             (benchmarks/completion.py, in its own process and database)

Every drain (core, peers) is timed on the database's clock from all workers ready to the
last completion recorded (benchmarks.common.run_drain), verified, and followed by a pgbench
run. Writes benchmarks/results/latest.json and latest.md, and the tables in
docs/performance.md (between the bench markers). Sizes: environment variables BENCH_* (see
benchmarks/sizes.py); databases: named after BENCH_DATABASE_URL (benchmarks.common).
Compare ratios within a run.

Each scenario is a module of benchmarks/scenarios (its run and its table); the project's
database is benchmarks/project.py, pgbench and gunicorn benchmarks/servers.py, the result
files and docs/performance.md's tables benchmarks/report.py. This module parses the
arguments and runs the scenarios asked for.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import ROOT, drop_database, log
from benchmarks.project import BENCH_PY, DB, migrate, setup_django, sql
from benchmarks.report import git_commit, keep_previous, markdown, write_outputs
from benchmarks.scenarios import SCENARIOS, core
from benchmarks.sizes import DEFAULTS

# What `make bench` runs without BENCH_ARGS.
DEFAULT_SCENARIOS = ["core", "http", "heartbeat", "growth", "reaper", "pickup", "completion"]

def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenarios", nargs="*", default=DEFAULT_SCENARIOS)
    parser.add_argument("--no-peers", action="store_true", help="core: skip the peers")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    wants_peers = "peers" in args.scenarios or ("core" in args.scenarios and not args.no_peers)
    if wants_peers and not Path(BENCH_PY).exists():
        raise SystemExit(f"{BENCH_PY} is missing: run `make bench` (it installs the peers)")
    migrate()
    setup_django()
    results = {
        "started_at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python "
                   f"{platform.python_version()}",
        "postgres": sql("SHOW server_version", fetch=True)[0][0],
        "sizes": {k: os.environ.get(k, v) for k, v in DEFAULTS.items()},
        "scenarios": {},
    }
    provenance = {"commit": git_commit()}
    if wants_peers:
        provenance["versions"] = json.loads(
            subprocess.run([BENCH_PY, "-m", "benchmarks.peers", "versions"], cwd=ROOT,
                           env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True,
                           capture_output=True, text=True).stdout)
    for name in args.scenarios:
        log(f"scenario {name}")
        t = time.perf_counter()
        if name == "core":
            results["scenarios"][name] = core.run(peers=not args.no_peers)
        else:
            results["scenarios"][name] = SCENARIOS[name].run()
        results["scenarios"][name]["measured_at"] = dt.datetime.now(dt.UTC).strftime(
            "%Y-%m-%d %H:%M UTC")
        results["scenarios"][name].update(provenance)
        log(f"scenario {name} done in {time.perf_counter() - t:.0f}s")
    if not args.no_write:
        keep_previous(results)
    md = markdown(results) if args.no_write else write_outputs(results)
    print(md)
    from django.db import connections

    connections.close_all()
    drop_database(DB)


if __name__ == "__main__":
    sys.exit(main())
