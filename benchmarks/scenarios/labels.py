"""The `labels` scenario (#28: "claim cost flat in the number of queued jobs the agent does not
match"): claim-next latency of an agent with labels, whose queue holds its own jobs and
labelled jobs it matches, with and without BENCH_LABELS_UNMATCHED queued jobs that wait for a
label no agent has, in its own workspace.

Two workspaces, the same but for those jobs: agent A's (none) and agent B's (the unmatched
jobs). Their claims alternate, A then B, so that the machine's noise falls on both alike;
each claim is reported at once (the queue's depth stays put). Each claimed job is checked to
be one the agent matches. Also the plan of B's claim statement with the unmatched jobs in
place and A's without them (EXPLAIN ANALYZE, BUFFERS): the buffers each touches.
"""

from __future__ import annotations

import json
import time

from benchmarks.common import log, percentile
from benchmarks.project import reset_tables, sql
from benchmarks.sizes import conf

TITLE = "Labels: claims beside jobs the agent does not match"


def _setup(name, matching):
    from jobqueue import lifecycle
    from jobqueue.models import Workspace

    ws = Workspace.objects.create(name=f"bench-labels-{name}")
    agent = lifecycle.create_job_agent(workspace=ws, name=f"fleet-{name}",
                                       labels=["gpu", "linux", "region=eu"], lease_seconds=60)
    gpu = lifecycle.label_set(ws.id, ["gpu", "linux"])
    for i in range(matching):  # half its own, half labelled (two sets it matches)
        if i % 2:
            lifecycle.create_job(workspace=ws, job_agent=agent, priority=i % 3)
        else:
            lifecycle.create_job(workspace=ws, labels=["gpu", "linux"] if i % 4 else ["linux"],
                                 priority=i % 3)
    return ws, agent, gpu


def _unmatched(ws, n):
    """n queued jobs waiting for `windows` (no agent has it), straight in SQL."""
    from jobqueue import lifecycle

    windows = lifecycle.label_set(ws.id, ["windows"])
    sql("INSERT INTO job (id, workspace_id, job_agent_id, labels, label_set_id, status, "
        "job_agent_config, dispatch_context, message, external_id, attempt, max_attempts, "
        "initial_max_attempts, priority, available_at, idempotency_fingerprint, created_at, "
        "updated_at) "
        "SELECT gen_random_uuid(), %(ws)s, NULL, '[\"windows\"]', %(set)s, 'queued', '{}', "
        "'{}', '', '', 0, 3, 3, i %% 5, now() - interval '1 hour', '', "
        "now() - make_interval(secs => %(n)s - i), now() FROM generate_series(1, %(n)s) i",
        {"ws": ws.id, "set": windows.id, "n": n})


def _claim(agent, matches, lat):
    from jobqueue import lifecycle, states

    t = time.perf_counter()
    grant = lifecycle.claim_next_job(agent)
    lat.append(time.perf_counter() - t)
    if grant is None or not matches(grant.job):
        raise SystemExit(f"labels: claim of {agent.name} took {grant and grant.job.labels}")
    lifecycle.report_status(grant.job.id, grant.claim_id, states.SUCCESSFUL,
                            job_agent_id=agent.id)
    # the queue keeps its depth: the same job again
    lifecycle.create_job(workspace=grant.job.workspace, job_agent=None if grant.job.labels
                         else agent, labels=grant.job.labels, priority=grant.job.priority)


def _plan(agent):
    from django.db import connection

    from jobqueue.lifecycle.pg import claim_statement

    statement = claim_statement(1, True)
    params = {"agent": agent.id, "limit": 1, "lease": 60, "kind": "claimed", "actor": "bench",
              "holder": "", "key": None}
    with connection.cursor() as cur:
        cur.execute("BEGIN")
        try:
            cur.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement, params)
            plan = cur.fetchone()[0]
        finally:
            cur.execute("ROLLBACK")
    plan = plan if isinstance(plan, list) else json.loads(plan)
    top = plan[0]["Plan"]
    return {"shared_buffers": top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0),
            "ms": plan[0]["Execution Time"]}


def run():
    samples, unmatched, matching = (conf("BENCH_LABELS_SAMPLES"), conf("BENCH_LABELS_UNMATCHED"),
                                    conf("BENCH_LABELS_MATCHING"))
    reset_tables()
    _ws_a, agent_a, _ = _setup("a", matching)
    ws_b, agent_b, _ = _setup("b", matching)
    t = time.perf_counter()
    _unmatched(ws_b, unmatched)
    sql("VACUUM ANALYZE job")
    log(f"labels: {unmatched:,} unmatched jobs in place ({time.perf_counter() - t:.0f}s)")

    def matches(job):
        return job.labels is None or set(job.labels) <= {"gpu", "linux", "region=eu"}

    without, beside = [], []
    for _ in range(50):  # warm both connections' plans
        _claim(agent_a, matches, [])
        _claim(agent_b, matches, [])
    for _ in range(samples):
        _claim(agent_a, matches, without)
        _claim(agent_b, matches, beside)
    out = {"samples": samples, "unmatched": unmatched, "matching": matching}
    for name, lat in (("without", without), ("beside", beside)):
        out[name] = {"p50_ms": 1000 * percentile(lat, 50), "p99_ms": 1000 * percentile(lat, 99)}
    out["p50_ratio"] = out["beside"]["p50_ms"] / out["without"]["p50_ms"]
    out["p99_ratio"] = out["beside"]["p99_ms"] / out["without"]["p99_ms"]
    out["plan"] = _plan(agent_b)
    out["plan_without"] = _plan(agent_a)
    left = sql("SELECT count(*) FROM job WHERE workspace_id = %s AND status = 'queued' "
               "AND labels = '[\"windows\"]'", [ws_b.id], fetch=True)[0][0]
    assert left == unmatched, left  # none of them was claimed
    log(f"labels: {out}")
    return out


def table(res):
    w, b = res["without"], res["beside"]
    return [
        "Claim-next by an agent with labels (each claim reported after its timing), "
        f"{res['samples']} claims each, alternating; its queue holds {res['matching']} jobs "
        f"it matches (its own and labelled), beside {res['unmatched']:,} queued jobs waiting "
        "for a label no agent has (`python -m benchmarks.run labels`).",
        "",
        "| queue | claim p50 ms | claim p99 ms |",
        "|---|---:|---:|",
        f"| without them | {w['p50_ms']:.2f} | {w['p99_ms']:.2f} |",
        f"| beside {res['unmatched']:,} unmatched | {b['p50_ms']:.2f} | {b['p99_ms']:.2f} |",
        f"| ratio | {res['p50_ratio']:.2f}x | {res['p99_ratio']:.2f}x |",
        "",
        f"The claim statement's plan (EXPLAIN ANALYZE) reads "
        f"{res['plan']['shared_buffers']} shared buffers beside them "
        f"({res['plan']['ms']:.2f} ms), {res['plan_without']['shared_buffers']} without "
        f"({res['plan_without']['ms']:.2f} ms).",
    ]
