"""The benchmark suite: `make bench` (or `python -m benchmarks.run`).

Scenarios (each verifies its own outcome before it reports):
  core       drain no-op jobs at 1/4/16 worker processes: the project's lifecycle (per job and
             in batches) next to pgbench (the machine's limit), raw psycopg loops and the
             peers procrastinate, pgqueuer and django-tasks-db (from .venv-bench)
  http       N agents (1/8/32) against gunicorn: claim-next, one heartbeat, a terminal report;
             next to a trivial authenticated DRF endpoint that runs one query
  heartbeat  thousands of live claims heartbeating (one by one and in batches); the job
             table's write counters; job_claim's share of HOT updates
  growth     claim-next latency with 10,000 vs 1,000,000 finished jobs; poll latency with
             10,000 queued jobs
  reaper     time to reap many expired claims at a few batch sizes

Writes benchmarks/results/latest.json and latest.md, and the tables in docs/performance.md
(between the bench markers). Sizes: environment variables BENCH_* (see DEFAULTS below).
All figures of one run come from the same machine state; compare ratios within a run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from benchmarks.common import (
    ROOT,
    db_url,
    drop_database,
    log,
    median,
    percentile,
    recreate_database,
    run_workers,
    throughput,
)

DEFAULTS = {
    "BENCH_REPS": 3,
    # procrastinate and django-tasks-db drain 3-10x slower than the rest: fewer runs of
    # them keep a full-size run short (0 = as many as BENCH_REPS).
    "BENCH_SLOW_PEER_REPS": 0,
    "BENCH_CORE_JOBS": 2000,
    "BENCH_CORE_CONCURRENCY": "1,4,16",
    "BENCH_PGBENCH_SECONDS": 5,
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
}
DB = "bench_jobqueue"
APP_PY = str(ROOT / ".venv" / "bin" / "python")
BENCH_PY = str(ROOT / ".venv-bench" / "bin" / "python")
RESULTS_DIR = ROOT / "benchmarks" / "results"
DOC = ROOT / "docs" / "performance.md"
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def retry(fn, what, attempts=3):
    """Run one measurement again (from scratch) when the database went away under it: the
    PostgreSQL of a shared machine may be restarted by someone else's test."""
    from django.db import connections

    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - logged, retried, re-raised at the end
            if attempt == attempts:
                raise
            log(f"{what}: {type(exc).__name__}: {str(exc)[:200]}; retrying")
            connections.close_all()
            time.sleep(10)


def conf(name):
    value = os.environ.get(name, DEFAULTS[name])
    if isinstance(DEFAULTS[name], int):
        return int(value)
    return [int(x) for x in str(value).split(",") if x]


# --- the project's database ---------------------------------------------------------------


def setup_django():
    os.environ["DATABASE_URL"] = db_url(DB)
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.bench_settings"
    import django

    django.setup()


def migrate():
    recreate_database(DB)
    subprocess.run([APP_PY, "manage.py", "migrate", "-v0"], cwd=ROOT, check=True,
                   env={**os.environ, "DATABASE_URL": db_url(DB)})


def sql(statement, params=None, fetch=False):
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(statement, params or [])
        return cur.fetchall() if fetch else None


def reset_tables():
    from django.db import connections

    sql("TRUNCATE job_event, job_claim, job, reaper_run")
    sql("VACUUM ANALYZE job")
    connections.close_all()


def make_agent(lease_seconds=60, max_attempts=3, name=None):
    from jobqueue.models import JobAgent, Workspace

    ws = Workspace.objects.create(name=f"bench-{uuid.uuid4().hex[:6]}")
    return JobAgent.objects.create(workspace=ws, name=name or "bench-agent",
                                   lease_seconds=lease_seconds, max_attempts=max_attempts)


def insert_jobs(agent, n, status="queued"):
    """n jobs straight in SQL (setup only; no lifecycle events), in chunks."""
    done = "now()" if status in ("successful", "failure", "cancelled", "expired") else "NULL"
    step = 200_000
    for start in range(0, n, step):
        k = min(n, start + step) - start
        sql(
            "INSERT INTO job (id, workspace_id, job_agent_id, status, job_agent_config, "
            "dispatch_context, message, external_id, attempt, max_attempts, "
            "initial_max_attempts, priority, available_at, idempotency_fingerprint, created_at, "
            f"updated_at, completed_at) SELECT gen_random_uuid(), %s, %s, %s, '{{}}', '{{}}', '', "
            "'', 0, 3, 3, 0, now() - interval '1 second', '', now() - interval '1 second', "
            f"now(), {done} FROM generate_series(1, %s)",
            [agent.workspace_id, agent.id, status, k],
        )


def count_by_status(agent):
    from jobqueue.models import Job

    rows = Job.objects.filter(job_agent=agent).values_list("status").order_by()
    out: dict = {}
    for (s,) in rows.iterator():
        out[s] = out.get(s, 0) + 1
    return out


def verify_drained(agent, n):
    """Every job terminal exactly once: n successful, no claim left, one report event each."""
    from django.db.models import Count

    from jobqueue.models import Job, JobClaim, JobEvent

    statuses = dict(
        Job.objects.filter(job_agent=agent).values_list("status").order_by("status")
        .annotate(n=Count("id"))
    )
    reported = JobEvent.objects.filter(job__job_agent=agent, kind="status_reported")
    problems = []
    if statuses != {"successful": n}:
        problems.append(f"statuses {statuses}, expected {{'successful': {n}}}")
    if JobClaim.objects.filter(job_agent=agent).exists():
        problems.append("claims left")
    if reported.count() != n or reported.values("job_id").distinct().count() != n:
        problems.append(f"{reported.count()} status events for {n} jobs")
    claimed = JobEvent.objects.filter(job__job_agent=agent, kind="claimed").count()
    if claimed != n:
        problems.append(f"{claimed} claims for {n} jobs (each should be claimed once)")
    if problems:
        raise SystemExit("verification failed: " + "; ".join(problems))


# --- scenario 1: core cycle ---------------------------------------------------------------


def pgbench_tps(clients, seconds):
    script = tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False)
    script.write("\\set aid random(1, 100000)\n"
                 "UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = :aid;\n")
    script.close()
    base = db_url("bench_pgbench").rsplit("/", 1)[0]
    host = base.split("@")[-1].split(":")[0]
    out = subprocess.run(
        ["pgbench", "-n", "-h", host, "-U", "postgres", "-c", str(clients),
         "-j", str(min(clients, 2)), "-T", str(seconds), "-f", script.name, "bench_pgbench"],
        capture_output=True, text=True, check=True,
    ).stdout
    os.unlink(script.name)
    m = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out)
    return float(m.group(1))


def lifecycle_sql_file() -> str:
    """The lifecycle's claim-next and terminal report statements, for the raw psycopg loop."""
    from jobqueue.lifecycle.pg import statements

    path = ROOT / "var" / "bench-lifecycle-sql.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({
        "claim": statements.JOB_CLAIM_AVAILABLE,
        "report": statements.JOB_SET_STATE_IF_RUNNING,
    }))
    return str(path)


def run_project_drain(kind, concurrency, n, batch=1, ack="single"):
    reset_tables()
    agent = make_agent()
    insert_jobs(agent, n)
    sql("ANALYZE job")
    from django.db import connections

    connections.close_all()
    args = {"core": [str(agent.id), str(batch), ack], "raw_shape": [str(agent.id)],
            "raw_cte": [str(agent.id), lifecycle_sql_file()]}[kind]
    cmds = [[APP_PY, "-m", "benchmarks.workers", kind, *args]] * concurrency
    results = run_workers(cmds, env={"DATABASE_URL": db_url(DB),
                                     "DJANGO_SETTINGS_MODULE": "config.settings"})
    total, elapsed, rate = throughput(results)
    if kind == "core" or kind == "raw_shape" or kind == "raw_cte":
        if kind == "core":
            verify_drained(agent, n)
        else:
            st = count_by_status(agent)
            if st != {"successful": n}:
                raise SystemExit(f"{kind}: statuses {st}")
    if total != n:
        raise SystemExit(f"{kind}: workers report {total} jobs, expected {n}")
    return rate


def run_peer(system, concurrency, n, batch=None):
    name = f"bench_{system}"
    recreate_database(name)
    env = {"DATABASE_URL": db_url(name)}
    full = {**os.environ, **env, "PYTHONPATH": str(ROOT)}
    subprocess.run([BENCH_PY, "-m", "benchmarks.peers", "setup", system, str(n)], cwd=ROOT,
                   env=full, check=True, capture_output=True)
    cmd = [BENCH_PY, "-m", "benchmarks.peers", "worker", system]
    if batch:
        cmd.append(str(batch))
    results = run_workers([cmd] * concurrency, env=env)
    subprocess.run([BENCH_PY, "-m", "benchmarks.peers", "verify", system, str(n)], cwd=ROOT,
                   env=full, check=True, capture_output=True)
    total = sum(r["n"] for r in results)
    if total != n:
        raise SystemExit(f"{system}: workers ran {total} jobs, expected {n}")
    elapsed = max(r["t1"] for r in results) - min(r["t0"] for r in results)
    drop_database(name)
    return n / elapsed


CORE_SYSTEMS = [
    ("pgbench", "pgbench: one single-row UPDATE by primary key per transaction (the limit)"),
    ("raw_cte", "raw psycopg, the lifecycle's SQL on PostgreSQL: one CTE per phase, 2 round "
     "trips a job (same SQL shape, no Django)"),
    ("raw_shape", "raw psycopg, the ORM path's statements (12 round trips a job, 2 commits)"),
    ("jobqueue", "jobqueue lifecycle: claim-next + terminal report"),
    ("jobqueue_b10", "jobqueue lifecycle: batch claim of 10 + a report per job"),
    ("jobqueue_b10_ack", "jobqueue lifecycle: batch claim of 10, then one batch report "
     "(report_many)"),
    ("jobqueue_b10_pipe", "jobqueue lifecycle: batch claim of 10, batch reports sent by a second "
     "thread meanwhile (the reference agent's shape)"),
    ("pgqueuer_b1", "pgqueuer 1.6.0, batch 1"),
    ("pgqueuer_b10", "pgqueuer 1.6.0, its default batch (10)"),
    ("procrastinate", "procrastinate 3.10.0"),
    ("djtasks", "django-tasks-db 0.13.0"),
]


def scenario_core(peers=True):
    n, reps = conf("BENCH_CORE_JOBS"), conf("BENCH_REPS")
    levels = conf("BENCH_CORE_CONCURRENCY")
    secs = conf("BENCH_PGBENCH_SECONDS")
    recreate_database("bench_pgbench")
    subprocess.run(["pgbench", "-i", "-q", "-s", "1", "-h", "127.0.0.1", "-U", "postgres",
                    "bench_pgbench"], check=True, capture_output=True)
    raw: dict = {key: {c: [] for c in levels} for key, _ in CORE_SYSTEMS}
    for rep in range(reps):
        for c in levels:
            runs = {
                "pgbench": lambda c=c: pgbench_tps(c, secs),
                "raw_shape": lambda c=c: run_project_drain("raw_shape", c, n),
                "raw_cte": lambda c=c: run_project_drain("raw_cte", c, n),
                "jobqueue": lambda c=c: run_project_drain("core", c, n, 1),
                "jobqueue_b10": lambda c=c: run_project_drain("core", c, n, 10),
                "jobqueue_b10_ack": lambda c=c: run_project_drain("core", c, n, 10, "batch"),
                "jobqueue_b10_pipe": lambda c=c: run_project_drain("core", c, n, 10,
                                                                   "pipelined"),
            }
            if peers:
                runs.update({
                    "pgqueuer_b1": lambda c=c: run_peer("pgqueuer", c, n, 1),
                    "pgqueuer_b10": lambda c=c: run_peer("pgqueuer", c, n, 10),
                })
                if rep < (conf("BENCH_SLOW_PEER_REPS") or reps):
                    runs.update({
                        "procrastinate": lambda c=c: run_peer("procrastinate", c, n),
                        "djtasks": lambda c=c: run_peer("djtasks", c, n),
                    })
            for key, fn in runs.items():
                value = retry(fn, f"core c={c} {key}")
                raw[key][c].append(value)
                log(f"core rep {rep + 1}/{reps} c={c} {key}: {value:,.0f}/s")
    drop_database("bench_pgbench")
    med = {key: {c: median(v) for c, v in by_c.items() if v} for key, by_c in raw.items()}
    return {"jobs": n, "reps": reps, "slow_peer_reps": conf("BENCH_SLOW_PEER_REPS") or reps,
            "levels": levels, "raw": raw, "median": med}


def core_table(res):
    levels, med = res["levels"], res["median"]
    lines = [
        f"Drain of {res['jobs']:,} no-op jobs per run, median of {res['reps']} runs, jobs/s "
        "(pgbench: transactions/s); in brackets the ratio to pgbench and to the raw psycopg loop "
        "of the same SQL shape (the lifecycle's statements on PostgreSQL), measured in the same "
        "run; the batch rows also give the ratio to pgqueuer at its default batch."
        + (f" procrastinate and django-tasks-db: median of {res['slow_peer_reps']} run(s)."
           if res.get("slow_peer_reps", res["reps"]) != res["reps"] else ""),
        "",
        "| system | " + " | ".join(f"c={c}" for c in levels) + " |",
        "|---|" + "---|" * len(levels),
    ]
    for key, label in CORE_SYSTEMS:
        if not med.get(key):
            continue
        cells = []
        for c in levels:
            v = med[key].get(c)
            if v is None:
                cells.append("")
                continue
            limit = med["pgbench"].get(c)
            shape = med["raw_cte"].get(c)
            cell = f"{v:,.0f}"
            if key != "pgbench" and limit:
                cell += f" ({v / limit:.2f}"
                cell += f"; {v / shape:.2f}× raw" if shape and key != "raw_cte" else ""
                peer = med.get("pgqueuer_b10", {}).get(c)
                if key.startswith("jobqueue_b10") and peer:
                    cell += f"; {v / peer:.2f}× pgqueuer b10"
                cell += ")"
            cells.append(cell)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


# --- scenario 2: HTTP cycle ---------------------------------------------------------------


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_gunicorn(workers):
    port = free_port()
    env = {**os.environ, "DATABASE_URL": db_url(DB),
           "DJANGO_SETTINGS_MODULE": "benchmarks.bench_settings", "PYTHONPATH": str(ROOT),
           "LOG_LEVEL": "WARNING"}
    (ROOT / "var").mkdir(exist_ok=True)
    errlog = open(ROOT / "var" / "bench-gunicorn.log", "w")  # noqa: SIM115 - lives with proc
    proc = subprocess.Popen(
        [str(ROOT / ".venv" / "bin" / "gunicorn"), "config.wsgi:application", "--bind",
         f"127.0.0.1:{port}", "--workers", str(workers), "--log-level", "warning"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=errlog, text=True,
    )
    import logging

    import httpx

    logging.getLogger("httpx").setLevel(logging.WARNING)
    for _ in range(200):
        try:
            httpx.get(f"http://127.0.0.1:{port}/v1/schema/", timeout=2)
            return proc, port
        except httpx.HTTPError:
            if proc.poll() is not None:
                raise RuntimeError("gunicorn exited: see var/bench-gunicorn.log") from None
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("gunicorn did not start")


def scenario_http():
    n, reps = conf("BENCH_HTTP_JOBS"), conf("BENCH_REPS")
    levels, workers = conf("BENCH_HTTP_AGENTS"), conf("BENCH_HTTP_WORKERS")
    proc, port = start_gunicorn(workers)
    root = f"http://127.0.0.1:{port}/"
    raw: dict = {c: [] for c in levels}
    try:
        for rep in range(reps):
            for c in levels:
                raw[c].append(retry(lambda c=c: http_level(c, n, root), f"http agents={c}"))
                log(f"http rep {rep + 1}/{reps} agents={c}: {raw[c][-1]['jobs_per_s']:,.0f} "
                    f"jobs/s, trivial {raw[c][-1]['trivial_per_s']:,.0f}/s")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return _http_summary(raw, levels, n, reps, workers)


def http_level(c, n, root):
    from agents import credentials

    reset_tables()
    agent = make_agent()
    token = credentials.issue_agent_token(agent)
    insert_jobs(agent, n)
    sql("ANALYZE job")
    base = f"{root}v1/workspaces/{agent.workspace_id}/"
    results = run_workers(
        [[APP_PY, "-m", "benchmarks.workers", "http_agent", base, str(agent.id),
          token]] * c
    )
    verify_http(agent, n)
    total, elapsed, rate = throughput(results)
    trivial = run_workers(
        [[APP_PY, "-m", "benchmarks.workers", "http_trivial", root, token,
          str(max(50, 3 * n // c))]] * c
    )
    t_total, t_elapsed, t_rate = throughput(trivial)
    lat = {k: [x for r in results for x in r["lat"][k]]
           for k in ("claim", "heartbeat", "status")}
    lat["trivial"] = [x for r in trivial for x in r["lat"]["trivial"]]
    row = {
        "jobs_per_s": rate,
        "trivial_per_s": t_rate,
        "requests_per_s": 3 * total / elapsed,
        "p50_ms": {k: 1000 * percentile(v, 50) for k, v in lat.items()},
        "p99_ms": {k: 1000 * percentile(v, 99) for k, v in lat.items()},
    }
    return row


def _http_summary(raw, levels, n, reps, workers):
    def med(c, path):
        vals = []
        for row in raw[c]:
            v = row
            for p in path:
                v = v[p]
            vals.append(v)
        return median(vals)

    summary = {}
    for c in levels:
        summary[c] = {
            "jobs_per_s": med(c, ["jobs_per_s"]),
            "requests_per_s": med(c, ["requests_per_s"]),
            "trivial_per_s": med(c, ["trivial_per_s"]),
            **{f"p50_{k}": med(c, ["p50_ms", k]) for k in ("claim", "heartbeat", "status",
                                                          "trivial")},
            **{f"p99_{k}": med(c, ["p99_ms", k]) for k in ("claim", "heartbeat", "status",
                                                          "trivial")},
        }
    return {"jobs": n, "reps": reps, "gunicorn_workers": workers, "raw": raw,
            "median": summary}


def verify_http(agent, n):
    verify_drained(agent, n)


def http_table(res):
    lines = [
        f"gunicorn with {res['gunicorn_workers']} sync workers on PostgreSQL; each agent process "
        f"loops claim-next → one heartbeat → terminal report over keep-alive HTTP; "
        f"{res['jobs']:,} jobs per run, median of {res['reps']} runs. The trivial endpoint "
        "authenticates the same agent token and runs one query (the framework's limit). "
        "Cost ratio = p50 of the endpoint / p50 of the trivial endpoint.",
        "",
        "| agents | jobs/s | agent requests/s | trivial requests/s | p50 / p99 ms: claim-next "
        "| heartbeat | report | trivial | p50 cost ratio claim / heartbeat / report |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c, m in res["median"].items():
        t = m["p50_trivial"]
        lines.append(
            f"| {c} | {m['jobs_per_s']:,.0f} | {m['requests_per_s']:,.0f} | "
            f"{m['trivial_per_s']:,.0f} | "
            + " | ".join(f"{m['p50_' + k]:.1f} / {m['p99_' + k]:.1f}"
                         for k in ("claim", "heartbeat", "status", "trivial"))
            + f" | {m['p50_claim'] / t:.2f} / {m['p50_heartbeat'] / t:.2f} / "
            f"{m['p50_status'] / t:.2f} |"
        )
    return lines


# --- scenario 3: heartbeat storm ----------------------------------------------------------


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


def scenario_heartbeat():
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


def heartbeat_table(res):
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


# --- scenario 4: growth -------------------------------------------------------------------


def sample_claim_latency(agent, samples):
    from jobqueue import lifecycle, states

    lat = []
    for _ in range(samples):
        s = time.perf_counter()
        g = lifecycle.claim_next_job(agent)
        lat.append(time.perf_counter() - s)
        if g is None:
            raise SystemExit("growth: nothing to claim")
        lifecycle.report_status(g.job.id, g.claim_id, states.SUCCESSFUL, job_agent_id=agent.id)
    return lat


def sample_poll_latency(agent, samples):
    """The agent poll's query (first page of 100 list items, claim order), as the API runs it."""
    from agents import serializers as s
    from jobqueue.models import Job

    lat = []
    for _ in range(samples):
        t = time.perf_counter()
        rows = list(
            Job.objects.filter(job_agent_id=agent.id).claimable().in_claim_order()
            .only(*s.LIST_ITEM_FIELDS)[:101]
        )
        lat.append(time.perf_counter() - t)
        assert len(rows) == 101
    return lat


def scenario_growth():
    small, large = conf("BENCH_GROWTH_SMALL"), conf("BENCH_GROWTH_LARGE")
    samples, queued = conf("BENCH_GROWTH_SAMPLES"), conf("BENCH_POLL_QUEUED")
    reset_tables()
    agent = make_agent()
    other = make_agent(name="other")
    out = {"samples": samples, "queued": queued}
    finished = 0
    for size in (small, large):
        t = time.perf_counter()
        # Finished jobs of this agent (half) and of another (half).
        insert_jobs(agent, (size - finished) // 2, status="successful")
        insert_jobs(other, size - finished - (size - finished) // 2, status="successful")
        finished = size
        insert_jobs(agent, queued)
        sql("VACUUM ANALYZE job")
        log(f"growth: {size:,} finished jobs in place ({time.perf_counter() - t:.0f}s)")
        claim = sample_claim_latency(agent, samples)
        poll = sample_poll_latency(agent, samples)
        out[size] = {
            "claim_p50_ms": 1000 * percentile(claim, 50), "claim_p99_ms": 1000 * percentile(claim,
                                                                                            99),
            "poll_p50_ms": 1000 * percentile(poll, 50), "poll_p99_ms": 1000 * percentile(poll, 99),
        }
        log(f"growth {size:,}: {out[size]}")
        # Leave only finished jobs for the next size: end the queued ones.
        sql("UPDATE job SET status = 'cancelled', completed_at = now() WHERE status = 'queued'")
        finished += queued
    from jobqueue.models import JobClaim, JobEvent

    if JobClaim.objects.exists():
        raise SystemExit("growth: claims left")
    reported = JobEvent.objects.filter(kind="status_reported")
    if reported.count() != 2 * samples or reported.values("job_id").distinct().count() != 2 * \
            samples:
        raise SystemExit("growth: each sampled job must be reported exactly once")
    out["sizes"] = [small, large]
    return out


def growth_table(res):
    lines = [
        f"Claim-next latency (lifecycle.claim_next_job, then a report; {res['samples']} samples) "
        f"and the agent poll's query (first page, {res['queued']:,} queued jobs) with a table "
        "holding this many finished jobs.",
        "",
        "| finished jobs in `job` | claim-next p50 / p99 ms | poll p50 / p99 ms |",
        "|---|---|---|",
    ]
    for size in res["sizes"]:
        m = res[size]
        lines.append(f"| {size:,} | {m['claim_p50_ms']:.2f} / {m['claim_p99_ms']:.2f} | "
                     f"{m['poll_p50_ms']:.2f} / {m['poll_p99_ms']:.2f} |")
    return lines


# --- scenario 5: reaper -------------------------------------------------------------------


def scenario_reaper():
    from jobqueue import reaper
    from jobqueue.models import Job, JobClaim, JobEvent

    n = conf("BENCH_REAPER_CLAIMS")
    out = {"claims": n, "runs": {}}
    for batch in conf("BENCH_REAPER_BATCHES"):
        reset_tables()
        agent = make_agent()
        insert_jobs(agent, n)
        sql("UPDATE job SET status = 'in_progress', attempt = 1, last_claim_id = "
            "gen_random_uuid(), started_at = now() WHERE job_agent_id = %s", [agent.id])
        sql("INSERT INTO job_claim (job_id, job_agent_id, claim_id, attempt, lease_seconds, "
            "claimed_at, claim_expires_at) SELECT id, job_agent_id, last_claim_id, 1, 60, "
            "now() - interval '2 minutes', now() - interval '1 minute' FROM job "
            "WHERE job_agent_id = %s", [agent.id])
        sql("VACUUM ANALYZE job")
        sql("VACUUM ANALYZE job_claim")
        t = time.perf_counter()
        result = reaper.sweep(batch_size=batch)
        elapsed = time.perf_counter() - t
        queued = Job.objects.filter(job_agent=agent, status="queued").count()
        reaped = JobEvent.objects.filter(kind="reaped")
        if (result.requeued != n or queued != n or JobClaim.objects.exists()
                or reaped.count() != n or reaped.values("job_id").distinct().count() != n):
            raise SystemExit(f"reaper batch {batch}: requeued {result.requeued}, queued {queued}")
        out["runs"][batch] = {"seconds": elapsed, "claims_per_s": n / elapsed,
                              "batches": result.batches}
        log(f"reaper batch {batch}: {n:,} in {elapsed:.1f}s")
    return out


def reaper_table(res):
    lines = [
        f"One `reaper.sweep()` over {res['claims']:,} expired claims (all requeued; each "
        "verified reaped exactly once).",
        "",
        "| batch size | seconds | claims/s | transactions |",
        "|---|---|---|---|",
    ]
    for batch, m in res["runs"].items():
        lines.append(f"| {batch} | {m['seconds']:.1f} | {m['claims_per_s']:,.0f} | "
                     f"{m['batches']} |")
    return lines


# --- output -------------------------------------------------------------------------------


def _int_keys(value):
    """JSON turned our integer keys (concurrency, sizes, batch sizes) into strings."""
    if isinstance(value, dict):
        return {(int(k) if isinstance(k, str) and k.isdigit() else k): _int_keys(v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [_int_keys(v) for v in value]
    return value



def markdown(results):
    started = results["started_at"]
    lines = [
        f"Last run {started} on {results['machine']}; PostgreSQL {results['postgres']}. "
        f"Sizes: {json.dumps(results['sizes'])}.",
        "",
    ]
    sections = [
        ("core", "Core cycle on PostgreSQL", core_table),
        ("http", "HTTP cycle", http_table),
        ("heartbeat", "Heartbeat storm", heartbeat_table),
        ("growth", "Growth", growth_table),
        ("reaper", "Reaper", reaper_table),
    ]
    for key, title, fn in sections:
        if key in results["scenarios"]:
            res = results["scenarios"][key]
            when = f" (measured {res['measured_at']})" if res.get("measured_at") else ""
            lines += [f"### {title}{when}", "", *fn(res), ""]
    return "\n".join(lines)


def write_outputs(results):
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    text = json.dumps(results, indent=1, default=str)
    (RESULTS_DIR / "latest.json").write_text(text + "\n")
    md = markdown(results)
    (RESULTS_DIR / "latest.md").write_text(md + "\n")
    if DOC.exists():
        doc = DOC.read_text()
        if BEGIN in doc and END in doc:
            head, rest = doc.split(BEGIN, 1)
            _, tail = rest.split(END, 1)
            DOC.write_text(f"{head}{BEGIN}\n{md}\n{END}{tail}")
    return md


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenarios", nargs="*",
                        default=["core", "http", "heartbeat", "growth", "reaper"])
    parser.add_argument("--no-peers", action="store_true", help="core: skip the peers")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    if not args.no_peers and "core" in args.scenarios and not Path(BENCH_PY).exists():
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
    runners = {"core": lambda: scenario_core(peers=not args.no_peers), "http": scenario_http,
               "heartbeat": scenario_heartbeat, "growth": scenario_growth,
               "reaper": scenario_reaper}
    for name in args.scenarios:
        log(f"scenario {name}")
        t = time.perf_counter()
        results["scenarios"][name] = runners[name]()
        results["scenarios"][name]["measured_at"] = dt.datetime.now(dt.UTC).strftime(
            "%Y-%m-%d %H:%M UTC")
        log(f"scenario {name} done in {time.perf_counter() - t:.0f}s")
    # Scenarios not run this time keep their latest results (each says when it was measured).
    previous = RESULTS_DIR / "latest.json"
    if not args.no_write and previous.exists():
        old = json.loads(previous.read_text()).get("scenarios", {})
        for name, value in old.items():
            if name not in results["scenarios"]:
                results["scenarios"][name] = _int_keys(value)
    md = markdown(results) if args.no_write else write_outputs(results)
    print(md)
    from django.db import connections

    connections.close_all()
    drop_database(DB)


if __name__ == "__main__":
    sys.exit(main())
