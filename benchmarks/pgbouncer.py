"""The core cycle behind PgBouncer (`make bench BENCH_ARGS=pgbouncer`; issue #26's item 5,
docs/performance.md "Behind PgBouncer"): claim-next + a successful report, one caller in this
process (lifecycle.claim_next_job, lifecycle.report_status), direct and through a real
PgBouncer configured as docs/deploying.md configures it (docs/deploy/pgbouncer.ini:
transaction pooling; tests/e2e/pgbouncer.py runs it), the way each deployment runs:

  direct             prepared statements (the default)
  pgbouncer          JOBQUEUE_PREPARED_STATEMENTS=0 through PgBouncer: the hot statements'
                     PL/pgSQL wrappers (jobqueue/lifecycle/pg/functions.py)
  pgbouncer_plain    the same without the wrappers: every statement parsed and planned per
                     call (how it ran before them)
  direct_unprepared  unprepared and direct, wrappers and all: what PgBouncer itself costs is
                     pgbouncer's rate against this one

Each round runs every variant once (its order alternating), each on BENCH_PGBOUNCER_JOBS jobs
after a warm-up on a fresh connection; the rates are medians over BENCH_PGBOUNCER_ROUNDS
rounds, the ratios against direct. The target: pgbouncer ≥ 0.8× direct.

On a shared machine a wall-clock rate swings with the neighbours' load, so each run also
counts the CPU time a cycle costs every process on its path (this one, the database's server
processes of the run's connections, PgBouncer), from /proc: it needs the PostgreSQL server on
this machine (None otherwise), and its ratio moves much less.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

VARIANTS = ("direct", "pgbouncer", "pgbouncer_plain", "direct_unprepared")
WARM_UP = 30
TARGET = 0.8


def _connect(variant: str, direct: dict, bouncer) -> None:
    """This process's connection as the variant runs (a new one)."""
    from django.conf import settings
    from django.db import connection

    from jobqueue.lifecycle.pg import cursor

    connection.close()
    connection.settings_dict.clear()
    connection.settings_dict.update(direct)
    settings.JOBQUEUE["PREPARED_STATEMENTS"] = variant == "direct"
    if variant.startswith("pgbouncer"):
        connection.settings_dict.update(HOST="127.0.0.1", PORT=bouncer.port,
                                        PASSWORD=bouncer.password)
    plain = variant == "pgbouncer_plain"
    cursor.HotCursor._wrapper_calls = (
        (lambda self, raw: {}) if plain else _WRAPPER_CALLS[0])


_WRAPPER_CALLS: list = []


def _cycles(agent, n: int) -> float:
    from jobqueue import lifecycle, states

    t0 = time.perf_counter()
    for _ in range(n):
        grant = lifecycle.claim_next_job(agent)
        lifecycle.report_status(grant.job.id, grant.claim_id, states.SUCCESSFUL)
    return n / (time.perf_counter() - t0)


def _cpu_seconds(pids) -> float | None:
    """The CPU time (user + system) the processes have used so far; None if one is not
    this machine's."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def _path_pids(bouncer, database: str) -> list[int]:
    """The processes a cycle runs in: the database's server processes but the one asking
    (the run's connection, direct or PgBouncer's), and PgBouncer (runuser's child as root)."""
    import psycopg

    from benchmarks.common import db_url

    with psycopg.connect(db_url(database), autocommit=True) as conn:
        pids = [r[0] for r in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND backend_type = 'client backend'")]
    top = bouncer.popen.pid
    children = Path(f"/proc/{top}/task/{top}/children")
    inner = children.read_text().split() if children.exists() else []
    return [*pids, *(int(p) for p in inner or [top])]


def _timed(agent, n: int, bouncer, database: str) -> tuple[float, float | None]:
    """(cycles/s, CPU µs a cycle on its whole path) of n cycles."""
    pids = _path_pids(bouncer, database)
    cpu0, server0 = time.process_time(), _cpu_seconds(pids)
    rate = _cycles(agent, n)
    cpu1, server1 = time.process_time(), _cpu_seconds(pids)
    if server0 is None or server1 is None:
        return rate, None
    return rate, (cpu1 - cpu0 + server1 - server0) / n * 1e6


def _statements_a_cycle(bouncer, database: str, agent, n: int) -> dict:
    """What PgBouncer counted for n cycles (its SHOW STATS): transactions and statements a
    cycle, and the server's time in them."""
    def totals():
        row = {r[0]: r for r in bouncer.show("STATS")}[database]
        # database, total_xact_count, total_query_count, ..., total_xact_time,
        # total_query_time (microseconds)
        return [float(v) for v in (row[1], row[2], row[5], row[6])]

    before = totals()
    _cycles(agent, n)
    after = totals()
    xacts, queries, xact_us, query_us = ((a - b) / n for a, b in zip(after, before,
                                                                      strict=True))
    return {"transactions": xacts, "statements": queries, "server_us": query_us}


def measure(rounds: int, n: int) -> dict:
    from django.conf import settings
    from django.db import connection

    from benchmarks.project import insert_jobs, make_agent, reset_tables, sql
    from jobqueue.lifecycle.pg import cursor
    from jobqueue.models import Job
    from tests.e2e.pgbouncer import PrivateBouncer

    direct = dict(connection.settings_dict)
    saved_jobqueue = dict(settings.JOBQUEUE)
    _WRAPPER_CALLS[:] = [cursor.HotCursor._wrapper_calls]
    bouncer = PrivateBouncer(direct.get("HOST") or "127.0.0.1", int(direct.get("PORT") or 5432),
                             direct["NAME"], user=direct.get("USER") or "postgres").start()
    rates: dict = {v: [] for v in VARIANTS}
    cpu: dict = {v: [] for v in VARIANTS}
    try:
        reset_tables()
        agent = make_agent()
        for r in range(rounds):
            for variant in (VARIANTS if r % 2 == 0 else VARIANTS[::-1]):
                _connect("direct", direct, bouncer)
                sql("DELETE FROM job_event WHERE job_id IN (SELECT id FROM job WHERE "
                    "job_agent_id = %s)", [agent.id])
                Job.objects.filter(job_agent=agent).delete()
                insert_jobs(agent, n + WARM_UP)
                sql("ANALYZE job")
                _connect(variant, direct, bouncer)
                _cycles(agent, WARM_UP)
                rate, used = _timed(agent, n, bouncer, direct["NAME"])
                rates[variant].append(rate)
                cpu[variant].append(used)
                _connect("direct", direct, bouncer)
                left = Job.objects.filter(job_agent=agent).exclude(status="successful").count()
                if left:
                    raise RuntimeError(f"pgbouncer {variant}: {left} jobs not successful")
        _connect("direct", direct, bouncer)
        insert_jobs(agent, 2 * WARM_UP)
        _connect("pgbouncer", direct, bouncer)
        _cycles(agent, WARM_UP)
        counted = _statements_a_cycle(bouncer, direct["NAME"], agent, WARM_UP)
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(direct)
        settings.JOBQUEUE.clear()
        settings.JOBQUEUE.update(saved_jobqueue)
        cursor.HotCursor._wrapper_calls = _WRAPPER_CALLS[0]
        bouncer.close()
    medians = {v: statistics.median(rates[v]) for v in VARIANTS}
    cpu_medians = {v: None if None in cpu[v] else statistics.median(cpu[v]) for v in VARIANTS}
    return {
        "jobs": n,
        "rounds": rounds,
        "rates": {v: {"median": medians[v], "runs": rates[v], "cpu_us": cpu_medians[v],
                      "cpu_runs": cpu[v]} for v in VARIANTS},
        "cpu_ratio": (None if None in (cpu_medians["direct"], cpu_medians["pgbouncer"])
                      else cpu_medians["direct"] / cpu_medians["pgbouncer"]),
        "ratio": medians["pgbouncer"] / medians["direct"],
        "ratio_plain": medians["pgbouncer_plain"] / medians["direct"],
        "pgbouncer_own": medians["pgbouncer"] / medians["direct_unprepared"],
        "a_cycle_through_pgbouncer": counted,
    }


def table(res: dict) -> list[str]:
    labels = {
        "direct": "direct, prepared statements",
        "pgbouncer": "through PgBouncer, unprepared, the wrappers",
        "pgbouncer_plain": "through PgBouncer, unprepared, the plain statements",
        "direct_unprepared": "direct, unprepared, the wrappers",
    }
    direct = res["rates"]["direct"]["median"]
    lines = [
        f"claim-next + successful report, one caller in-process; {res['jobs']} jobs a run, "
        f"medians of {res['rounds']} interleaved rounds; PgBouncer as docs/deploy/pgbouncer.ini "
        "configures it (transaction pooling).",
        "",
        "| how | cycles/s | × direct | runs | CPU a cycle (all processes) | × direct |",
        "| --- | ---: | ---: | --- | ---: | ---: |",
    ]
    direct_cpu = res["rates"]["direct"].get("cpu_us")
    for variant in VARIANTS:
        row = res["rates"][variant]
        used = row.get("cpu_us")
        cpu = ("n/a | n/a" if used is None or direct_cpu is None
               else f"{used:,.0f} µs | {direct_cpu / used:.2f}×")
        lines.append(f"| {labels[variant]} | {row['median']:,.0f} | "
                     f"{row['median'] / direct:.2f}× | "
                     f"{', '.join(f'{x:,.0f}' for x in row['runs'])} | {cpu} |")
    c = res["a_cycle_through_pgbouncer"]
    verdict = "met" if res["ratio"] >= TARGET else "not met"
    by_cpu = "n/a" if res.get("cpu_ratio") is None else f"{res['cpu_ratio']:.2f}×"
    lines += [
        "",
        f"Through PgBouncer: {res['ratio']:.2f}× direct (target ≥ {TARGET}×: {verdict}); "
        f"by the CPU a cycle costs, {by_cpu}; without the wrappers {res['ratio_plain']:.2f}×. "
        f"PgBouncer's own cost: the rate through it is {res['pgbouncer_own']:.2f}× the direct "
        f"unprepared one. A cycle through it: {c['transactions']:.1f} transactions, "
        f"{c['statements']:.1f} statements, {c['server_us']:,.0f} µs in them (PgBouncer's "
        "SHOW STATS).",
    ]
    return lines
