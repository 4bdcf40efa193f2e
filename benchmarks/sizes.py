"""The suite's sizes: each one an environment variable BENCH_*, its default here.

`make bench BENCH_ARGS=... BENCH_CORE_JOBS=...` (or `python -m benchmarks.run`) reads them
through `conf`; every result file records the sizes of its run.
"""

from __future__ import annotations

import os

DEFAULTS = {
    "BENCH_REPS": 3,
    # procrastinate and django-tasks-db drain 3-10x slower than the rest: fewer runs of
    # them keep a full-size run short (0 = as many as BENCH_REPS).
    "BENCH_SLOW_PEER_REPS": 0,
    "BENCH_CORE_JOBS": 2000,
    "BENCH_CORE_CONCURRENCY": "1,4,16",
    "BENCH_PGBENCH_SECONDS": 5,
    # The `peers` scenario (each peer's configurations): levels and runs.
    "BENCH_PEERS_CONCURRENCY": "1,4",
    "BENCH_PEERS_REPS": 1,
    "BENCH_HTTP_JOBS": 600,
    "BENCH_HTTP_AGENTS": "1,8,32",
    "BENCH_HTTP_WORKERS": 4,
    "BENCH_HEARTBEAT_CLAIMS": 3000,
    "BENCH_HEARTBEAT_ROUNDS": 2,
    "BENCH_GROWTH_SMALL": 10_000,
    "BENCH_GROWTH_LARGE": 1_000_000,
    "BENCH_GROWTH_SAMPLES": 300,
    "BENCH_POLL_QUEUED": 10_000,
    "BENCH_REAPER_CLAIMS": 100_000,
    "BENCH_REAPER_BATCHES": "100,500,2000",
    # completion (benchmarks/completion.py): the outbox's cost, the sender, the pruner.
    "BENCH_OUTBOX_JOBS": 1000,
    "BENCH_OUTBOX_REPS": 3,
    "BENCH_PRUNE_JOBS": 1_000_000,
    "BENCH_PICKUP_AGENTS": "1,100,1000",
    "BENCH_PICKUP_JOBS": 100,
    "BENCH_PICKUP_POLL_JOBS": 8,
    "BENCH_PICKUP_WORKERS": 5,
    "BENCH_PICKUP_HEARTBEATS": 300,
    "BENCH_WAL_JOBS": 2000,
    "BENCH_READERS_JOBS": 1_000_000,
    "BENCH_READERS_SAMPLES": 200,
    "BENCH_LABELS_SAMPLES": 2000,
    "BENCH_LABELS_UNMATCHED": 100_000,
    "BENCH_LABELS_MATCHING": 200,
    "BENCH_CONCURRENCY_SAMPLES": 2000,
    "BENCH_CONCURRENCY_JOBS": 100_000,
    "BENCH_CONCURRENCY_KEYS": 1000,
    "BENCH_CONCURRENCY_PICKUPS": 100,
    "BENCH_CONCURRENCY_WINDOWS": 20,
    "BENCH_FAIRNESS_JOBS": 3000,
    "BENCH_FAIRNESS_CLAIMS": 3000,
    "BENCH_PGBOUNCER_JOBS": 500,
    "BENCH_PGBOUNCER_ROUNDS": 7,
}


def conf(name):
    value = os.environ.get(name, DEFAULTS[name])
    if isinstance(DEFAULTS[name], int):
        return int(value)
    return [int(x) for x in str(value).split(",") if x]
