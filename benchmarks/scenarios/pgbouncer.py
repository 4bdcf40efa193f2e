"""The `pgbouncer` scenario: the core cycle (claim-next + report, one caller in-process)
direct and through a real PgBouncer in transaction mode as docs/deploying.md configures it
(benchmarks/pgbouncer.py): rates, the ratio (target >= 0.8x); BENCH_PGBOUNCER_JOBS jobs a
run, BENCH_PGBOUNCER_ROUNDS interleaved rounds.
"""

from __future__ import annotations

from benchmarks import pgbouncer
from benchmarks.sizes import conf

TITLE = "Behind PgBouncer (transaction pooling)"


def run():
    return pgbouncer.measure(conf("BENCH_PGBOUNCER_ROUNDS"), conf("BENCH_PGBOUNCER_JOBS"))


def table(res):
    return pgbouncer.table(res)
