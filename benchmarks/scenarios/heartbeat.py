"""The `heartbeat` scenario: thousands of live claims heartbeating (one by one and in
batches); the job table's write counters; job_claim's share of HOT updates.
"""

from __future__ import annotations

import datetime as dt
import shutil
import tempfile
import time
from pathlib import Path

from benchmarks.common import db_url, log, run_workers, throughput
from benchmarks.project import (
    APP_PY,
    DB,
    insert_jobs,
    make_agent,
    reset_tables,
    verify_drained,
)
from benchmarks.sizes import conf

TITLE = "Heartbeat storm"


def table_stats(names=("job", "job_claim")):
    from django.db import connection, connections

    connections.close_all()  # our own backend flushes its counters when it exits
    time.sleep(1.2)
    with connection.cursor() as cur:
        cur.execute("SELECT pg_stat_clear_snapshot()")
        cur.execute(
            "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del "
            "FROM pg_stat_user_tables WHERE relname = ANY(%s)", [list(names)]
        )
        rows = cur.fetchall()
    return {r[0]: {"ins": r[1], "upd": r[2], "hot": r[3], "del": r[4]} for r in rows}


def run():
    from jobqueue import lifecycle, states

    n, rounds = conf("BENCH_HEARTBEAT_CLAIMS"), conf("BENCH_HEARTBEAT_ROUNDS")
    procs = 4
    reset_tables()
    agent = make_agent(lease_seconds=3600)
    insert_jobs(agent, n)
    grants = []
    while True:
        got = lifecycle.claim_next_jobs(agent, 100)
        if not got:
            break
        grants.extend(got)
    assert len(grants) == n
    tmp = Path(tempfile.mkdtemp())
    files = []
    for i in range(procs):
        f = tmp / f"claims{i}.txt"
        f.write_text("".join(f"{g.job.id} {g.claim_id}\n" for g in grants[i::procs]))
        files.append(str(f))
    out = {"claims": n, "rounds": rounds, "processes": procs}
    for mode in ("single", "batch"):
        before = table_stats()
        results = run_workers(
            [[APP_PY, "-m", "benchmarks.workers", "heartbeat", str(agent.id), f, mode,
              str(rounds)] for f in files],
            env={"DATABASE_URL": db_url(DB), "DJANGO_SETTINGS_MODULE": "config.settings"},
        )
        after = table_stats()
        total, elapsed, rate = throughput(results)
        refused = sum(r.get("refused", 0) for r in results)
        if total != n * rounds or refused:
            raise SystemExit(f"heartbeat {mode}: {total} renewed, {refused} refused")
        delta = {t: {k: after[t][k] - before[t][k] for k in after[t]} for t in after}
        hot = delta["job_claim"]["hot"] / delta["job_claim"]["upd"] if delta["job_claim"][
            "upd"] else float("nan")
        out[mode] = {"heartbeats_per_s": rate, "job_writes": delta["job"],
                     "job_claim_writes": delta["job_claim"], "hot_share": hot}
        log(f"heartbeat {mode}: {rate:,.0f}/s, job writes {delta['job']}, HOT {hot:.2%}")
        if any(delta["job"].values()):
            out[mode]["job_table_moved"] = True
    shutil.rmtree(tmp)
    # Outcome: every claim still live and current, then every job terminal exactly once.
    from jobqueue.models import JobClaim

    live = JobClaim.objects.filter(job_agent=agent, claim_expires_at__gt=dt.datetime.now(dt.UTC))
    if live.count() != n:
        raise SystemExit(f"heartbeat: {live.count()} live claims, expected {n}")
    for g in grants:
        lifecycle.report_status(g.job.id, g.claim_id, states.SUCCESSFUL, job_agent_id=agent.id)
    verify_drained(agent, n)
    return out


def table(res):
    lines = [
        f"{res['claims']:,} live claims, {res['processes']} processes, each renewing its share "
        f"{res['rounds']} times through the lifecycle: one heartbeat per call, or batches of 100 "
        "(heartbeat_many). Write counters from pg_stat_user_tables, before/after.",
        "",
        "| mode | heartbeats/s | job table writes (ins/upd/del) | job_claim updates | HOT share |",
        "|---|---|---|---|---|",
    ]
    for mode in ("single", "batch"):
        m = res[mode]
        jw = m["job_writes"]
        lines.append(
            f"| {mode} | {m['heartbeats_per_s']:,.0f} | {jw['ins']}/{jw['upd']}/{jw['del']} | "
            f"{m['job_claim_writes']['upd']:,} | {m['hot_share']:.1%} |"
        )
    return lines
