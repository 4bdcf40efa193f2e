"""The `concurrency` scenario (#29 item 1 and 5): claims beside jobs that concurrency keys hold
back, and how soon a freed slot's job is taken.

Claim cost: two workspaces with BENCH_CONCURRENCY_JOBS queued jobs of one agent each: A's
without keys, B's spread over BENCH_CONCURRENCY_KEYS concurrency keys at limit 1 (so all but
one job a key is held back). Their claims alternate, A then B, so that the machine's noise
falls on both alike; each claimed job is reported and a job like it created (the queues keep
their depth; B's new job is held back behind its key). B's claims are checked never to run
two jobs of a key. Target: B's claim p50 within 2x of A's.

Pickup: one key at limit 1 with a job running and BENCH_CONCURRENCY_PICKUPS more queued
behind it; an agent long-polls (claim-next with wait_seconds) in a thread while the main
thread reports the running job: the time from the report's commit to the waiter holding the
next job's claim (target p50 <= 50 ms).

Rate limit window (#29 item 3): one rate limit key at 1 claim a second with
BENCH_CONCURRENCY_WINDOWS + 1 jobs queued; an agent long-polls for each next job: how late,
on the database's clock, each claim comes after the window let it through (its started_at
less the previous claim's started_at plus the period).
"""

from __future__ import annotations

import threading
import time

from benchmarks.common import log, percentile
from benchmarks.project import reset_tables, sql
from benchmarks.sizes import conf

TITLE = "Concurrency keys: claims beside held-back jobs, and a freed slot's pickup"


def _setup(name):
    from jobqueue import lifecycle
    from jobqueue.models import Workspace

    ws = Workspace.objects.create(name=f"bench-concurrency-{name}")
    agent = lifecycle.create_job_agent(workspace=ws, name=f"agent-{name}", lease_seconds=60)
    return ws, agent


def _fill(ws, agent, n, keys):
    """n queued jobs of the agent, straight in SQL; with `keys`, spread over that many keys at
    limit 1, each key's first job in claim order given its slot and the others held back, as
    the triggers would leave them (written directly: the triggers fire on status changes and
    inserts, and 100,000 inserts in one statement would each count their key's jobs with a
    plan made when the table was empty)."""
    sql("INSERT INTO job (id, workspace_id, job_agent_id, status, job_agent_config, "
        "dispatch_context, message, external_id, attempt, max_attempts, initial_max_attempts, "
        "priority, available_at, idempotency_fingerprint, created_at, updated_at) "
        "SELECT gen_random_uuid(), %(ws)s, %(agent)s, 'queued', '{}', '{}', '', '', 0, 3, "
        "3, i %% 3, now() - interval '1 hour', '', now() - make_interval(secs => %(n)s - i), "
        "now() FROM generate_series(1, %(n)s) i",
        {"ws": ws.id, "agent": agent.id, "n": n})
    if keys:
        sql("UPDATE job SET concurrency_key = k.key, concurrency_limit = 1, "
            "concurrency_held = CASE WHEN k.rn = 1 THEN NULL ELSE true END "
            "FROM (SELECT id, key, row_number() OVER (PARTITION BY key ORDER BY "
            "priority DESC, available_at, created_at) AS rn FROM (SELECT id, priority, "
            "available_at, created_at, 'tenant-' || (row_number() OVER (ORDER BY "
            "created_at) %% %(keys)s) AS key FROM job WHERE workspace_id = %(ws)s) n) k "
            "WHERE job.id = k.id",
            {"ws": ws.id, "keys": keys})


def _claim(agent, lat, keyed):
    from jobqueue import lifecycle, states

    t = time.perf_counter()
    grant = lifecycle.claim_next_job(agent)
    lat.append(time.perf_counter() - t)
    if grant is None:
        raise SystemExit(f"concurrency: {agent.name} claimed nothing")
    job = grant.job
    if keyed:
        running = sql("SELECT count(*) FROM job WHERE workspace_id = %s AND concurrency_key = %s "
                      "AND status = 'in_progress'", [job.workspace_id, job.concurrency_key],
                      fetch=True)[0][0]
        if running != 1:
            raise SystemExit(f"concurrency: {running} jobs of {job.concurrency_key} running")
    lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL, job_agent_id=agent.id)
    lifecycle.create_job(workspace=job.workspace, job_agent=agent, priority=job.priority,
                         concurrency_key=job.concurrency_key,
                         concurrency_limit=job.concurrency_limit)


def _pickups(n):
    """Report the key's running job while an agent waits for the next one: seconds from the
    report's commit to the waiter holding its claim, n times."""
    from django.db import connection

    from jobqueue import lifecycle, states, wakeups

    ws, agent = _setup("pickup")
    for _ in range(n + 1):
        lifecycle.create_job(workspace=ws, job_agent=agent, concurrency_key="deploy")
    (grant,) = lifecycle.claim_next(agent)
    out = []
    for _ in range(n):
        got = {}

        def wait(got=got):
            got["grants"] = lifecycle.claim_next(agent, wait_seconds=10)
            got["at"] = time.perf_counter()
            connection.close()

        waiter = threading.Thread(target=wait)
        waiter.start()
        wakeups.hub().connected.wait(5)
        time.sleep(0.05)  # the waiter has checked once and waits
        lifecycle.report_status(grant.job.id, grant.claim_id, states.SUCCESSFUL,
                                job_agent_id=agent.id)
        committed = time.perf_counter()
        waiter.join(15)
        if not got.get("grants"):
            raise SystemExit("concurrency: the waiter took nothing")
        out.append(got["at"] - committed)
        (grant,) = got["grants"]
    return out


def _windows(n):
    """Long-poll claims of a key limited to 1 a second: each one's lateness after its window
    opened, on the database's clock, n times."""
    from jobqueue import lifecycle, states
    from jobqueue.lifecycle import ratelimits

    ws, agent = _setup("window")
    ratelimits.set_limit(ws.id, "partner", 1, 1)
    for _ in range(n + 1):
        lifecycle.create_job(workspace=ws, job_agent=agent, rate_limit_key="partner")
    (grant,) = lifecycle.claim_next(agent)
    out = []
    for _ in range(n):
        lifecycle.report_status(grant.job.id, grant.claim_id, states.SUCCESSFUL,
                                job_agent_id=agent.id)
        got = lifecycle.claim_next(agent, wait_seconds=10)
        if not got:
            raise SystemExit("concurrency: no claim when the rate limit's window opened")
        late = (got[0].job.started_at - grant.job.started_at).total_seconds() - 1
        if late < 0:
            raise SystemExit(f"concurrency: a claim {-late:.3f}s inside the window")
        out.append(late)
        (grant,) = got
    return out


def run():
    samples, jobs, keys, pickups = (conf("BENCH_CONCURRENCY_SAMPLES"),
                                    conf("BENCH_CONCURRENCY_JOBS"),
                                    conf("BENCH_CONCURRENCY_KEYS"),
                                    conf("BENCH_CONCURRENCY_PICKUPS"))
    reset_tables()
    ws_a, agent_a = _setup("a")
    ws_b, agent_b = _setup("b")
    t = time.perf_counter()
    _fill(ws_a, agent_a, jobs, 0)
    _fill(ws_b, agent_b, jobs, keys)
    sql("VACUUM ANALYZE job")
    held = sql("SELECT count(*) FROM job WHERE concurrency_held", fetch=True)[0][0]
    log(f"concurrency: {jobs:,} jobs each in place, {held:,} held back "
        f"({time.perf_counter() - t:.0f}s)")
    without, beside = [], []
    for _ in range(50):  # warm both connections' plans
        _claim(agent_a, [], False)
        _claim(agent_b, [], True)
    for _ in range(samples):
        _claim(agent_a, without, False)
        _claim(agent_b, beside, True)
    out = {"samples": samples, "jobs": jobs, "keys": keys, "held": held}
    for name, lat in (("without", without), ("beside", beside)):
        out[name] = {"p50_ms": 1000 * percentile(lat, 50), "p99_ms": 1000 * percentile(lat, 99)}
    out["p50_ratio"] = out["beside"]["p50_ms"] / out["without"]["p50_ms"]
    out["p99_ratio"] = out["beside"]["p99_ms"] / out["without"]["p99_ms"]
    picked = _pickups(pickups)
    out["pickup"] = {"n": pickups, "p50_ms": 1000 * percentile(picked, 50),
                     "p99_ms": 1000 * percentile(picked, 99)}
    windows = _windows(conf("BENCH_CONCURRENCY_WINDOWS"))
    out["window"] = {"n": len(windows), "p50_ms": 1000 * percentile(windows, 50),
                     "p99_ms": 1000 * percentile(windows, 99)}
    log(f"concurrency: {out}")
    return out


def table(res):
    w, b, p = res["without"], res["beside"], res["pickup"]
    return [
        "Claim-next (each claim reported after its timing and a job like it created), "
        f"{res['samples']} claims each, alternating: a queue of {res['jobs']:,} jobs without "
        f"keys, and one of {res['jobs']:,} jobs over {res['keys']:,} concurrency keys at limit "
        f"1 ({res['held']:,} held back) (`python -m benchmarks.run concurrency`).",
        "",
        "| queue | claim p50 ms | claim p99 ms |",
        "|---|---:|---:|",
        f"| without keys | {w['p50_ms']:.2f} | {w['p99_ms']:.2f} |",
        f"| {res['keys']:,} keys | {b['p50_ms']:.2f} | {b['p99_ms']:.2f} |",
        f"| ratio | {res['p50_ratio']:.2f}x | {res['p99_ratio']:.2f}x |",
        "",
        f"A freed slot's pickup (a report frees the key's slot while an agent long-polls; "
        f"from the report's commit to the waiter holding the next job, {p['n']} times): "
        f"p50 {p['p50_ms']:.1f} ms, p99 {p['p99_ms']:.1f} ms.",
    ] + ([] if "window" not in res else [
        "",
        f"A rate limit's window (1 claim a second; an agent long-polls for each next job; "
        f"how late each claim comes after its window opened, on the database's clock, "
        f"{res['window']['n']} times): p50 {res['window']['p50_ms']:.1f} ms, "
        f"p99 {res['window']['p99_ms']:.1f} ms.",
    ])
