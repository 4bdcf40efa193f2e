"""The `readers` scenario: every index on `job` and the reader it serves
(benchmarks/readers.py): whether the reader's plan reads it, and its latency, on
BENCH_READERS_JOBS jobs (BENCH_READERS_SAMPLES runs a reader).
"""

from __future__ import annotations

from benchmarks import readers
from benchmarks.sizes import conf

TITLE = "Who reads each index on job"


def run():
    return readers.measure(conf("BENCH_READERS_JOBS"), conf("BENCH_READERS_SAMPLES"))


def table(res):
    return readers.table(res)
