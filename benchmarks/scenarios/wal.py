"""The `wal` scenario: what a job costs the database over the API (benchmarks/wal.py):
WAL bytes and transactions a job on the single and the batch path, and where the bytes go
(pg_waldump, per relation); BENCH_WAL_JOBS jobs a path.
"""

from __future__ import annotations

from benchmarks import wal
from benchmarks.common import run_workers
from benchmarks.sizes import conf

TITLE = "What a job costs the database (WAL)"


def run():
    return wal.measure(lambda cmd: run_workers(cmd), conf("BENCH_WAL_JOBS"))


def table(res):
    return wal.table(res)
