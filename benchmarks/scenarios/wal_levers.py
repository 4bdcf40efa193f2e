"""The `wal_levers` scenario: what each lever on #26's WAL target would save, the hot
statements run by hand under variants (benchmarks/wal_levers.py); BENCH_WAL_JOBS jobs a path.
"""

from __future__ import annotations

from benchmarks import wal_levers
from benchmarks.sizes import conf

TITLE = "What each WAL lever would save (the hot statements, by hand)"


def run():
    return wal_levers.measure(conf("BENCH_WAL_JOBS"))


def table(res):
    return wal_levers.table(res)
