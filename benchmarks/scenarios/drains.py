"""Drains shared by the `core` and `peers` scenarios: the project's workers and each
peer's drain the same no-op jobs, timed on the database's clock (benchmarks.common.run_drain)
and verified; pgbench runs between them (`Bracketed`), and the tables divide by it.
"""

from __future__ import annotations

import json
import os
import subprocess

from benchmarks import peers as peer_configs
from benchmarks.common import (
    ROOT,
    db_name,
    db_url,
    drop_database,
    median,
    recreate_database,
    run_drain,
)
from benchmarks.project import (
    APP_PY,
    BENCH_PY,
    DB,
    count_by_status,
    insert_jobs,
    make_agent,
    reset_tables,
    retry,
    sql,
    verify_drained,
)
from benchmarks.servers import pgbench_tps

# Every peer drain of this run: its length and the set-up that round 1 counted into it.
DRAINS: list = []


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


def noise(pgbench_runs):
    """The spread of pgbench's runs at each level: (max - min) / median."""
    return {c: {"min": min(v), "median": median(v), "max": max(v),
                "spread": (max(v) - min(v)) / median(v)} for c, v in pgbench_runs.items() if v}


def noise_line(res):
    parts = [f"c={c}: {m['min']:,.0f}–{m['max']:,.0f} tps ({m['spread']:.0%})"
             for c, m in res.get("noise", {}).items()]
    return ("Machine noise, every pgbench run of the level (between the drains): "
            + "; ".join(parts) + ".") if parts else ""


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
