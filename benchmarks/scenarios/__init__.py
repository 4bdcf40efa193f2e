"""One module per scenario of the suite (`python -m benchmarks.run <scenario>...`).

Each module holds its scenario's sizes (BENCH_* through benchmarks.sizes.conf), its `run()`,
which measures, verifies the outcome and returns the results, and its `table(res)`, the
markdown lines docs/performance.md prints under its `TITLE`. What a scenario runs in another
process or another virtualenv stays in benchmarks/ beside it (benchmarks.workers,
benchmarks.peers, benchmarks.completion) with the measuring helpers the tests use
(benchmarks.readers, benchmarks.wal, benchmarks.pgbouncer).
"""

from __future__ import annotations

from benchmarks.scenarios import (
    completion,
    concurrency,
    core,
    fairness,
    growth,
    heartbeat,
    http,
    labels,
    peers,
    pgbouncer,
    pickup,
    readers,
    reaper,
    wal,
    wal_levers,
)

# Every scenario by name, in the order docs/performance.md prints their sections.
SCENARIOS = {
    "core": core,
    "peers": peers,
    "http": http,
    "heartbeat": heartbeat,
    "growth": growth,
    "reaper": reaper,
    "pickup": pickup,
    "completion": completion,
    "labels": labels,
    "concurrency": concurrency,
    "fairness": fairness,
    "wal": wal,
    "wal_levers": wal_levers,
    "readers": readers,
    "pgbouncer": pgbouncer,
}
