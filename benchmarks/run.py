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
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import peers as peer_configs
from benchmarks.common import (
    ROOT,
    db_name,
    db_url,
    drop_database,
    log,
    median,
    percentile,
    recreate_database,
    run_drain,
    run_workers,
    throughput,
)
from benchmarks.project import (
    APP_PY,
    BENCH_PY,
    DB,
    count_by_status,
    insert_jobs,
    make_agent,
    migrate,
    reset_tables,
    retry,
    setup_django,
    sql,
    verify_drained,
)
from benchmarks.servers import pgbench_tps, setup_pgbench, start_gunicorn
from benchmarks.sizes import DEFAULTS, conf

RESULTS_DIR = ROOT / "benchmarks" / "results"
DOC = ROOT / "docs" / "performance.md"
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


# --- scenario 1: core cycle ---------------------------------------------------------------


def lifecycle_sql_file() -> str:
    """The lifecycle's claim-next and terminal report statements, for the raw psycopg loop."""
    from jobqueue.lifecycle.pg import claim_statement
    from jobqueue.sql import postgresql

    path = ROOT / "var" / "bench-lifecycle-sql.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({
        "claim": claim_statement(1),
        "report": postgresql.job_set_state_if_running,
    }))
    return str(path)


def last_completed_at(agent):
    """Epoch of the last job completion of this agent, on the database's clock."""
    return float(sql("SELECT extract(epoch FROM max(completed_at)) FROM job "
                     "WHERE job_agent_id = %s", [agent.id], fetch=True)[0][0] or 0)


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
    results, elapsed = run_drain(
        cmds, env={"DATABASE_URL": db_url(DB), "DJANGO_SETTINGS_MODULE": "config.settings"},
        database=DB, last_done_at=lambda: last_completed_at(agent),
    )
    if kind == "core":
        verify_drained(agent, n)
    else:
        st = count_by_status(agent)
        if st != {"successful": n}:
            raise SystemExit(f"{kind}: statuses {st}")
    total = sum(r["n"] for r in results)
    if total != n:
        raise SystemExit(f"{kind}: workers report {total} jobs, expected {n}")
    return n / elapsed


def peer_call(action, system, *args, env):
    out = subprocess.run([BENCH_PY, "-m", "benchmarks.peers", action, system, *args],
                         cwd=ROOT, env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"peers {action} {system}: {out.stderr[-3000:]}")
    return out.stdout


def run_peer(config, concurrency, n):
    """One drain of a peer in `config` (benchmarks.peers.CONFIGS) with `concurrency`
    consumers; verified (every job done exactly once), timed on the database's clock."""
    system = config["system"]
    name = db_name(system)
    recreate_database(name)
    env = {"DATABASE_URL": db_url(name)}
    spec = json.dumps(config)
    peer_call("setup", system, str(n), spec, env=env)
    checked = {}

    def last_done_at():
        checked.update(json.loads(peer_call("verify", system, str(n), env=env)))
        return checked["last_done_at"]

    cmds = [[BENCH_PY, "-m", "benchmarks.peers", "worker", system, spec, str(k)]
            for k in peer_configs.split(config, concurrency)]
    results, elapsed = run_drain(cmds, env=env, database=name, last_done_at=last_done_at)
    total = sum(r["n"] for r in results)
    if total != n or checked["done"] != n:
        raise SystemExit(f"{system}: workers ran {total} jobs, {checked['done']} recorded "
                         f"done, expected {n}")
    drop_database(name)
    setups = [r["setup_s"] for r in results if r.get("setup_s") is not None]
    DRAINS.append({"config": config, "c": concurrency, "jobs": n, "seconds": elapsed,
                   "setup_s": max(setups) if setups else None})
    return n / elapsed


# Every peer drain of this run: its length and the set-up that round 1 counted into it.
DRAINS: list = []


PEER_LABELS = {  # {v}: the peer's version in the run
    "pgqueuer_b1": "pgqueuer {v}, batch 1",
    "pgqueuer_b10": "pgqueuer {v}, its default batch (10)",
    "procrastinate": "procrastinate {v}",
    "djtasks": "django-tasks-db {v}",
}
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
    *PEER_LABELS.items(),
]
SLOW_PEERS = ("procrastinate", "djtasks")


class Bracketed:
    """Drains at one concurrency level with pgbench run between them, so that pgbench samples
    the same minutes as the drains. The tables divide by the median of the level's pgbench
    runs (robust to a burst of load during one 3-5 s pgbench run); each drain's ratio to the
    two pgbench runs around it is kept too (`ratios_adjacent` in the results)."""

    def __init__(self, c, secs):
        self.c, self.secs = c, secs
        self.pgbench = [self._pgbench()]

    def _pgbench(self):
        return retry(lambda: pgbench_tps(self.c, self.secs), f"pgbench c={self.c}")

    def measure(self, fn, what):
        value = retry(fn, what)
        self.pgbench.append(self._pgbench())
        return value, value / ((self.pgbench[-2] + self.pgbench[-1]) / 2)


def scenario_core(peers=True):
    """Every system drains the same jobs at each concurrency, pgbench between drains."""
    n, reps = conf("BENCH_CORE_JOBS"), conf("BENCH_REPS")
    levels = conf("BENCH_CORE_CONCURRENCY")
    secs = conf("BENCH_PGBENCH_SECONDS")
    setup_pgbench()
    raw: dict = {key: {c: [] for c in levels} for key, _ in CORE_SYSTEMS}
    ratios: dict = {key: {c: [] for c in levels} for key, _ in CORE_SYSTEMS}
    for rep in range(reps):
        for c in levels:
            runs = {
                "raw_shape": lambda c=c: run_project_drain("raw_shape", c, n),
                "raw_cte": lambda c=c: run_project_drain("raw_cte", c, n),
                "jobqueue": lambda c=c: run_project_drain("core", c, n, 1),
                "jobqueue_b10": lambda c=c: run_project_drain("core", c, n, 10),
                "jobqueue_b10_ack": lambda c=c: run_project_drain("core", c, n, 10, "batch"),
                "jobqueue_b10_pipe": lambda c=c: run_project_drain("core", c, n, 10,
                                                                   "pipelined"),
            }
            if peers:
                for key in PEER_LABELS:
                    if key in SLOW_PEERS and rep >= (conf("BENCH_SLOW_PEER_REPS") or reps):
                        continue
                    runs[key] = lambda c=c, key=key: run_peer(peer_configs.CONFIGS[key], c, n)
            level = Bracketed(c, secs)
            for key, fn in runs.items():
                value, ratio = level.measure(fn, f"core c={c} {key}")
                raw[key][c].append(value)
                ratios[key][c].append(ratio)
                log(f"core rep {rep + 1}/{reps} c={c} {key}: {value:,.0f}/s ({ratio:.3f} of "
                    f"pgbench {level.pgbench[-2]:,.0f}-{level.pgbench[-1]:,.0f})")
            raw["pgbench"][c] += level.pgbench
    drop_database(db_name("pgbench"))
    med = {key: {c: median(v) for c, v in by_c.items() if v} for key, by_c in raw.items()}
    return {"jobs": n, "reps": reps, "slow_peer_reps": conf("BENCH_SLOW_PEER_REPS") or reps,
            "levels": levels, "raw": raw, "ratios_adjacent": ratios, "median": med,
            "noise": noise(raw["pgbench"]), "drains": list(DRAINS),
            "peer_configs": {k: peer_configs.CONFIGS[k] for k in PEER_LABELS} if peers else {}}


def noise(pgbench_runs):
    """The spread of pgbench's runs at each level: (max - min) / median."""
    return {c: {"min": min(v), "median": median(v), "max": max(v),
                "spread": (max(v) - min(v)) / median(v)} for c, v in pgbench_runs.items() if v}


def noise_line(res):
    parts = [f"c={c}: {m['min']:,.0f}–{m['max']:,.0f} tps ({m['spread']:.0%})"
             for c, m in res.get("noise", {}).items()]
    return ("Machine noise, every pgbench run of the level (between the drains): "
            + "; ".join(parts) + ".") if parts else ""


def core_table(res):
    levels, med = res["levels"], res["median"]
    versions = res.get("versions", {})
    small = ("**A small run** (the targets are read from 20,000 jobs a drain, 3 runs). "
             if res["jobs"] < 20_000 else "")
    lines = [
        small + f"Drain of {res['jobs']:,} no-op jobs per run, median of {res['reps']} runs, "
        "jobs/s (pgbench: transactions/s), timed from the moment every worker is ready to "
        "the last completion the database recorded; in brackets the ratio to pgbench (the "
        "median of its runs between this level's drains) and to the raw psycopg loop of the "
        "same SQL shape (the lifecycle's statements on PostgreSQL); "
        "the batch rows also give the ratio to pgqueuer at its default batch."
        + (f" procrastinate and django-tasks-db: median of {res['slow_peer_reps']} run(s)."
           if res.get("slow_peer_reps", res["reps"]) != res["reps"] else ""),
        "",
        "| system | " + " | ".join(f"c={c}" for c in levels) + " |",
        "|---|" + "---|" * len(levels),
    ]
    # Ratios to the median of the level's pgbench runs; the other ratios divide those.
    norm = {k: {lv: x / med["pgbench"][lv] for lv, x in by.items() if med["pgbench"].get(lv)}
            for k, by in med.items() if k != "pgbench"}
    for key, label in CORE_SYSTEMS:
        if not med.get(key):
            continue
        if key in PEER_LABELS:
            config = res.get("peer_configs", {}).get(key)
            label = label.format(v=peer_version(config, versions) if config else "")
        cells = []
        for c in levels:
            v = med[key].get(c)
            if v is None:
                cells.append("")
                continue
            r = norm.get(key, {}).get(c)
            shape = norm.get("raw_cte", {}).get(c)
            cell = f"{v:,.0f}"
            if key != "pgbench" and r:
                cell += f" ({r:.2f}"
                cell += f"; {r / shape:.2f}× raw" if shape and key != "raw_cte" else ""
                peer = norm.get("pgqueuer_b10", {}).get(c)
                if key.startswith("jobqueue_b10") and peer:
                    cell += f"; {r / peer:.2f}× pgqueuer b10"
                cell += ")"
            cells.append(cell)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", noise_line(res), ""] if res.get("noise") else [""]
    if res.get("peer_configs"):
        lines.append("How each peer ran (`benchmarks.peers.CONFIGS`):")
        lines += [f"- {PEER_LABELS[k].format(v=peer_version(cfg, versions))}: {describe(cfg)}"
                  for k, cfg in res["peer_configs"].items()]
    if res.get("commit"):
        lines += ["", f"jobqueue at commit {res['commit']}."]
    return lines


def peer_version(config, versions):
    package = {"pgqueuer": "pgqueuer", "procrastinate": "procrastinate",
               "djtasks": "django-tasks-db"}[config["system"]]
    return versions.get(package, "")


def describe(config):
    """One line for a peer configuration, as the tables print it."""
    procs = config.get("processes", "c")
    where = ("one worker process per consumer" if procs == "c" else
             f"{procs} worker process{'es' if procs != 1 else ''}, consumers shared out")
    if config["system"] == "pgqueuer":
        what = (f"batch {config['batch']}, {config['driver']} driver (one connection per "
                f"QueueManager), {config['loop']} event loop, drain mode")
    elif config["system"] == "procrastinate":
        what = (f"{config.get('task', 'async')} no-op task, `run_worker(concurrency=<consumers "
                "in the process>, wait=False)`, psycopg connector with its default pool")
    else:
        age = config.get("conn_max_age", 0)
        what = (f"`db_worker --batch`, CONN_MAX_AGE={'None' if age is None else age}")
    gate = (", released before its set-up (round-1 harness)" if config.get("gate") == "start"
            else "")
    return f"{what}; {where}{gate}"


# --- scenario 1b: each peer's configurations ----------------------------------------------


def scenario_peers():
    """Every configuration of benchmarks.peers.SWEEP at each level, pgbench between drains,
    to pick (and show) each peer's best: BENCH_CORE_JOBS jobs a drain, BENCH_PEERS_REPS
    runs."""
    n, reps = conf("BENCH_CORE_JOBS"), conf("BENCH_PEERS_REPS")
    levels, secs = conf("BENCH_PEERS_CONCURRENCY"), conf("BENCH_PGBENCH_SECONDS")
    setup_pgbench()
    pgbench: dict = {c: [] for c in levels}
    raw: dict = {system: {label: {c: [] for c in levels} for label in sweep}
                 for system, sweep in peer_configs.SWEEP.items()}
    ratios: dict = {system: {label: {c: [] for c in levels} for label in sweep}
                    for system, sweep in peer_configs.SWEEP.items()}
    for rep in range(reps):
        for c in levels:
            level = Bracketed(c, secs)
            seen = set()
            for system, sweep in peer_configs.SWEEP.items():
                for label, cfg in sweep.items():
                    config = {"system": system, **cfg}
                    shape = json.dumps({**config, "processes": peer_configs.split(config, c)},
                                       sort_keys=True)
                    if shape in seen:  # e.g. "one process" at c=1: measured already
                        continue
                    seen.add(shape)
                    value, ratio = level.measure(
                        lambda config=config, c=c: run_peer(config, c, n),
                        f"peers c={c} {system} {label}")
                    raw[system][label][c].append(value)
                    ratios[system][label][c].append(ratio)
                    log(f"peers rep {rep + 1}/{reps} c={c} {system} [{label}]: {value:,.0f}/s "
                        f"({ratio:.3f} of pgbench)")
            pgbench[c] += level.pgbench
    drop_database(db_name("pgbench"))

    def medians(values):
        return {system: {label: {c: median(v) for c, v in by_c.items() if v}
                         for label, by_c in rows.items()} for system, rows in values.items()}

    return {"jobs": n, "reps": reps, "levels": levels, "pgbench": pgbench,
            "noise": noise(pgbench), "raw": raw, "ratios_adjacent": ratios,
            "median": medians(raw), "sweep": peer_configs.SWEEP, "drains": list(DRAINS),
            "chosen": peer_configs.CONFIGS}


def peers_table(res):
    levels = res["levels"]
    lines = [
        f"Each peer in each configuration: drain of {res['jobs']:,} no-op jobs, "
        f"median of {res['reps']} run(s): jobs/s and (in brackets) the ratio to the median "
        "of the level's pgbench runs (run between the drains); timed from every worker ready "
        "to the last completion the database recorded. Best per level in bold. c = consumers in "
        "all (worker processes × consumers per process); an empty cell is the same shape as "
        "a row above.",
        "",
        "| peer | configuration | " + " | ".join(f"c={c}" for c in levels) + " |",
        "|---|---|" + "---|" * len(levels),
    ]
    names = {"pgqueuer": "pgqueuer", "procrastinate": "procrastinate",
             "djtasks": "django-tasks-db"}
    limit = {c: median(v) for c, v in res["pgbench"].items() if v}
    for system, rows in res["median"].items():
        best = {c: max((r.get(c, 0) for r in rows.values()), default=0) for c in levels}
        for label, by_c in rows.items():
            cells = []
            for c in levels:
                v = by_c.get(c)
                if v is None:
                    cells.append("")
                    continue
                cell = f"{v:,.0f} ({v / limit[c]:.3f})" if limit.get(c) else f"{v:,.0f}"
                cells.append(f"**{cell}**" if v == best[c] and len(rows) > 1 else cell)
            lines.append(f"| {names[system]} | {label} | " + " | ".join(cells) + " |")
    lines += ["", noise_line(res)]
    return lines


# --- scenario 2: HTTP cycle ---------------------------------------------------------------


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
        f"gunicorn with {res['gunicorn_workers']} gthread workers (config/gunicorn.conf.py) on "
        "PostgreSQL; each agent process loops claim-next → one heartbeat → terminal report "
        "over keep-alive HTTP; "
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
    from jobqueue.maintenance import reaper
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



# --- pickup: long-poll ----------------------------------------------------------------------


def _xact_commits():
    return sql("SELECT xact_commit + xact_rollback FROM pg_stat_database "
               "WHERE datname = current_database()", fetch=True)[0][0]


class _Agents:
    """`n` agent threads on one job agent, each looping claim-next (held `wait` seconds, or
    polling with the reference agent's idle backoff when wait is 0); when each claim arrived,
    by job id."""

    def __init__(self, base, agent_id, token, n, wait):
        import threading

        import httpx

        self.claimed, self.cond = {}, threading.Condition()
        self.stop = threading.Event()
        self.base, self.agent_id, self.wait = base, agent_id, wait
        self.headers = {"Authorization": f"Bearer {token}"}
        self.threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(n)]
        self.httpx = httpx
        for t in self.threads:
            t.start()
            time.sleep(0.002)  # their first claims spread out

    def _loop(self):
        import random

        url = f"{self.base}job-agents/{self.agent_id}/jobs/claim"
        body = {"wait_seconds": self.wait} if self.wait else {}
        idle = 0.2
        with self.httpx.Client(headers=self.headers, timeout=self.wait + 30) as http:
            while not self.stop.is_set():
                asked = time.monotonic()
                try:
                    r = http.post(url, json=body)
                except self.httpx.HTTPError:
                    time.sleep(0.5)
                    continue
                if r.status_code == 200:
                    with self.cond:
                        self.claimed[r.json()["job"]["id"]] = time.perf_counter()
                        self.cond.notify_all()
                    idle = 0.2
                elif not self.wait or time.monotonic() - asked < self.wait / 2:
                    # Polling, or an empty answer that came early (a process at its cap of
                    # held waits), as the reference agent: equal-jitter backoff, 0.2 s to 5 s.
                    time.sleep(idle / 2 + random.uniform(0, idle / 2))
                    idle = min(5.0, idle * 2)

    def wait_for(self, job_id, timeout):
        with self.cond:
            self.cond.wait_for(lambda: job_id in self.claimed, timeout)
            return self.claimed.get(job_id)


def pickup_level(n_agents, n_jobs, wait, workers, pause=(0.02, 0.02)):
    import random

    import httpx

    from agents import credentials

    reset_tables()
    agent = make_agent()
    token = credentials.issue_agent_token(agent)
    key = credentials.issue_workspace_api_key(agent.workspace)
    # Each process's cap on held waits with headroom over an even split (the agents'
    # connections do not spread evenly over the workers; past a cap, agents poll).
    cap = max(200, math.ceil(1.5 * n_agents / workers))
    proc, port = start_gunicorn(workers, env_extra={"JOBQUEUE_MAX_WAITING_CLAIMS": str(cap)})
    base = f"http://127.0.0.1:{port}/v1/workspaces/{agent.workspace_id}/"
    agents = _Agents(base, agent.id, token, n_agents, wait)
    try:
        time.sleep(2 + n_agents / 200)  # all of them held (or backed off)
        before, t0 = _xact_commits(), time.perf_counter()
        time.sleep(5)
        idle_tps = (_xact_commits() - before) / (time.perf_counter() - t0)
        lat = []
        with httpx.Client(base_url=base, headers={"X-API-Key": key}, timeout=30) as producer:
            for _ in range(n_jobs):
                sent = time.perf_counter()
                r = producer.post("jobs", json={"job_agent_id": str(agent.id)})
                r.raise_for_status()
                got = agents.wait_for(r.json()["id"], 15)
                if got is None:
                    raise RuntimeError("a job was not picked up within 15 s")
                lat.append(got - sent)
                time.sleep(random.uniform(*pause))
    finally:
        agents.stop.set()
        proc.terminate()  # ends the held waits
        proc.wait(timeout=30)
    return {"agents": n_agents, "jobs": n_jobs, "wait_seconds": wait, "waits_per_process": cap,
            "p50_ms": 1000 * percentile(lat, 50), "p99_ms": 1000 * percentile(lat, 99),
            "max_ms": 1000 * max(lat), "idle_db_tps": idle_tps}


def heartbeats_under_waits(n_waits, samples, workers):
    """Another agent's heartbeat latency (one client, keep-alive, one after another) with no
    held wait, then while `n_waits` claims wait on an empty queue, then with none again."""
    import httpx

    from agents import credentials
    from jobqueue import lifecycle

    reset_tables()
    waiting, beating = make_agent(name="waiting"), make_agent(name="beating")
    grant = lifecycle.claim_job(beating, lifecycle.create_job(
        workspace=beating.workspace, job_agent=beating)[0].id)
    cap = max(200, math.ceil(1.5 * n_waits / workers))
    proc, port = start_gunicorn(workers, env_extra={"JOBQUEUE_MAX_WAITING_CLAIMS": str(cap)})
    base = f"http://127.0.0.1:{port}/v1/workspaces/{beating.workspace_id}/"
    token = credentials.issue_agent_token(beating)

    def sample(http):
        lat = []
        for _ in range(samples):
            started = time.perf_counter()
            r = http.post(f"jobs/{grant.job.id}/heartbeat", json={"claim_id": str(grant.claim_id)})
            r.raise_for_status()
            lat.append(time.perf_counter() - started)
        return {"p50_ms": 1000 * percentile(lat, 50), "p99_ms": 1000 * percentile(lat, 99)}

    try:
        with httpx.Client(base_url=base, timeout=30,
                          headers={"Authorization": f"Bearer {token}"}) as http:
            sample(http)  # warm
            before = sample(http)
            agents = _Agents(f"http://127.0.0.1:{port}/v1/workspaces/{waiting.workspace_id}/",
                             waiting.id, credentials.issue_agent_token(waiting), n_waits, 50)
            try:
                time.sleep(2 + n_waits / 200)  # all of them held
                during = sample(http)
            finally:
                agents.stop.set()
            proc.send_signal(signal.SIGHUP)  # new workers: the held waits end, none is left
            time.sleep(3)
            sample(http)  # the new workers warm
            after = sample(http)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    idle = max(before["p99_ms"], after["p99_ms"])
    return {"waits": n_waits, "samples": samples, "before": before, "during": during,
            "after": after, "p99_ratio": during["p99_ms"] / idle}


def scenario_pickup():
    levels, n = conf("BENCH_PICKUP_AGENTS"), conf("BENCH_PICKUP_JOBS")
    workers = conf("BENCH_PICKUP_WORKERS")
    rows = []
    for c in levels:
        rows.append(retry(lambda c=c: pickup_level(c, n, 50, workers), f"pickup agents={c}"))
        log(f"pickup agents={c}: p50 {rows[-1]['p50_ms']:.1f} ms, p99 {rows[-1]['p99_ms']:.1f} "
            f"ms, idle db {rows[-1]['idle_db_tps']:.1f} tx/s")
    poll = pickup_level(1, conf("BENCH_PICKUP_POLL_JOBS"), 0, workers, pause=(1.0, 4.0))
    log(f"pickup polling agent: p50 {poll['p50_ms']:.0f} ms, p99 {poll['p99_ms']:.0f} ms")
    beats = heartbeats_under_waits(200, conf("BENCH_PICKUP_HEARTBEATS"), workers)
    log(f"heartbeats with 200 held waits: p99 {beats['during']['p99_ms']:.1f} ms, "
        f"{beats['p99_ratio']:.2f}x idle")
    return {"workers": workers, "levels": rows, "polling": poll, "heartbeats": beats}


def pickup_table(res):
    lines = [
        f"gunicorn -c config/gunicorn.conf.py ({res['workers']} gthread workers) on PostgreSQL. "
        "Pickup: from sending `POST jobs` to the agent holding the claim (client clock); "
        "idle db tx/s: the database's commits per second while the agents wait on an empty "
        "queue (pg_stat_database, over 5 s).",
        "",
        "| agents | claim mode | held waits per process (cap) | jobs | pickup p50 | "
        "pickup p99 | max | idle db tx/s |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in [*res["levels"], res["polling"]]:
        mode = f"wait_seconds={row['wait_seconds']}" if row["wait_seconds"] else \
            "polling, idle backoff to 5 s"
        lines.append(f"| {row['agents']} | {mode} | {row.get('waits_per_process', 200)} | "
                     f"{row['jobs']} | {row['p50_ms']:.1f} ms | "
                     f"{row['p99_ms']:.1f} ms | {row['max_ms']:.1f} ms | "
                     f"{row['idle_db_tps']:.1f} |")
    beats = res.get("heartbeats")
    if beats:
        lines += [
            "",
            f"Another agent's heartbeats (one client, {beats['samples']} one after another) "
            f"with no held wait, while {beats['waits']} claims wait on an empty queue, and "
            "with none again (new workers); target: p99 while waits are held within 2× of "
            "the idle p99 (the worse of before and after).",
            "",
            "| heartbeats | p50 | p99 |",
            "| --- | ---: | ---: |",
            *(f"| {label} | {beats[k]['p50_ms']:.1f} ms | {beats[k]['p99_ms']:.1f} ms |"
              for k, label in (("before", "no held wait"),
                               ("during", f"{beats['waits']} held waits"),
                               ("after", "no held wait (after)"))),
            "",
            f"p99 with the held waits: {beats['p99_ratio']:.2f}× the idle p99.",
        ]
    return lines


def scenario_completion():
    """benchmarks/completion.py in its own process (it sets Django up on its own database)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           **{k: str(conf(k)) for k in ("BENCH_OUTBOX_JOBS", "BENCH_OUTBOX_REPS",
                                        "BENCH_PRUNE_JOBS")}}
    env.pop("DATABASE_URL", None)
    out = subprocess.run([APP_PY, "-m", "benchmarks.completion"], cwd=ROOT, env=env,
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def scenario_wal():
    from benchmarks import wal

    return wal.measure(lambda cmd: run_workers(cmd), conf("BENCH_WAL_JOBS"))


def scenario_readers():
    from benchmarks import readers

    return readers.measure(conf("BENCH_READERS_JOBS"), conf("BENCH_READERS_SAMPLES"))


def readers_table(res):
    from benchmarks import readers

    return readers.table(res)


def wal_table(res):
    from benchmarks import wal

    return wal.table(res)


def scenario_pgbouncer():
    from benchmarks import pgbouncer

    return pgbouncer.measure(conf("BENCH_PGBOUNCER_ROUNDS"), conf("BENCH_PGBOUNCER_JOBS"))


def pgbouncer_table(res):
    from benchmarks import pgbouncer

    return pgbouncer.table(res)


def completion_table(res):
    o, snd, p = res["outbox"], res["sender"], res["prune"]
    before, during = p["cycle_ms_before"], p["cycle_ms_during"]
    return [
        "One process, PostgreSQL (benchmarks/completion.py). Outbox: claim-next + successful "
        "report per job without and with one webhook endpoint (medians of interleaved runs). "
        "Sender: one sender to a local receiver. Prune: finished jobs (each with one event) "
        "deleted by `prune_jobs` in its own process, and the claim-next + report cycle of "
        "another agent before and while it runs.",
        "",
        "| measure | value |",
        "| --- | ---: |",
        f"| cycle without an endpoint | {o['per_job_ms_without']:.3f} ms/job |",
        f"| cycle with one endpoint (the outbox row) | {o['per_job_ms_with_one_endpoint']:.3f}"
        f" ms/job (+{o['outbox_cost_ms_per_job']:.3f} ms, {o['ratio']:.2f}×) |",
        f"| webhook sender | {snd['deliveries_per_second']:,.0f} deliveries/s "
        f"({snd['deliveries']} deliveries) |",
        f"| pruning {p['jobs']:,} finished jobs | {p['rows_per_second']:,.0f} jobs/s "
        f"({p['seconds']:.1f} s, {p['batches']} batches) |",
        f"| cycle p50 / p99 before pruning | {before['p50']:.2f} / {before['p99']:.2f} ms "
        f"(n={before['n']}) |",
        f"| cycle p50 / p99 while pruning | {during['p50']:.2f} / {during['p99']:.2f} ms "
        f"(n={during['n']}) |",
    ]


def markdown(results):
    started = results["started_at"]
    lines = [
        f"Last run {started} on {results['machine']}; PostgreSQL {results['postgres']}. "
        f"Sizes: {json.dumps(results['sizes'])}.",
        "",
    ]
    sections = [
        ("core", "Core cycle on PostgreSQL", core_table),
        ("peers", "Each peer's configurations", peers_table),
        ("http", "HTTP cycle", http_table),
        ("heartbeat", "Heartbeat storm", heartbeat_table),
        ("growth", "Growth", growth_table),
        ("reaper", "Reaper", reaper_table),
        ("pickup", "Pickup (long-poll)", pickup_table),
        ("completion", "Completion: outbox, webhook sender, pruning", completion_table),
        ("wal", "What a job costs the database (WAL)", wal_table),
        ("readers", "Who reads each index on job", readers_table),
        ("pgbouncer", "Behind PgBouncer (transaction pooling)", pgbouncer_table),
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


def git_commit():
    """The commit measured (with `+changes` when the code differs from it: anything tracked
    but the result files)."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True,
                              text=True).stdout.strip()

    commit = git("rev-parse", "--short=12", "HEAD") or "unknown"
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".",
                  ":!benchmarks/results", ":!docs")
    return commit + ("+changes" if changed else "")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenarios", nargs="*",
                        default=["core", "http", "heartbeat", "growth", "reaper", "pickup",
                                 "completion"])
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
    runners = {"core": lambda: scenario_core(peers=not args.no_peers), "http": scenario_http,
               "peers": scenario_peers, "heartbeat": scenario_heartbeat,
               "growth": scenario_growth, "reaper": scenario_reaper,
               "pickup": scenario_pickup, "completion": scenario_completion,
               "wal": scenario_wal, "readers": scenario_readers,
               "pgbouncer": scenario_pgbouncer}
    provenance = {"commit": git_commit()}
    if wants_peers:
        provenance["versions"] = json.loads(
            subprocess.run([BENCH_PY, "-m", "benchmarks.peers", "versions"], cwd=ROOT,
                           env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True,
                           capture_output=True, text=True).stdout)
    for name in args.scenarios:
        log(f"scenario {name}")
        t = time.perf_counter()
        results["scenarios"][name] = runners[name]()
        results["scenarios"][name]["measured_at"] = dt.datetime.now(dt.UTC).strftime(
            "%Y-%m-%d %H:%M UTC")
        results["scenarios"][name].update(provenance)
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
