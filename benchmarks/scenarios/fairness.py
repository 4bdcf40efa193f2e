"""The `fairness` scenario (#29 item 2): claimed shares of fairness keys of weights 1, 1 and 2,
all backlogged, and the drain's throughput against the same drain without keys.

Two workspaces with an agent each. The fair one: BENCH_FAIRNESS_JOBS jobs of key `a`, then as
many of `b`, then of `heavy` (weight 2: PUT fairness-keys/heavy), created one by one through
the service (lifecycle.create_job, as POST jobs does), so that creation order favours `a`
as much as it can. The plain one: as many jobs without keys, created the same way. Then
BENCH_FAIRNESS_CLAIMS claim-next + report cycles on each, alternating (the machine's noise
falls on both alike). Targets: the fair drain's shares within +-5 % of 25 / 25 / 50, and its
throughput >= 0.9x the plain drain's.
"""

from __future__ import annotations

import collections
import time

from benchmarks.common import log, percentile
from benchmarks.project import reset_tables, sql
from benchmarks.sizes import conf

TITLE = "Fair shares: claimed shares by weight, and the drain beside one without keys"
WEIGHTS = {"a": 1, "b": 1, "heavy": 2}


def _setup(name):
    from jobqueue import lifecycle
    from jobqueue.models import Workspace

    ws = Workspace.objects.create(name=f"bench-fairness-{name}")
    agent = lifecycle.create_job_agent(workspace=ws, name=f"agent-{name}", lease_seconds=60)
    return ws, agent


def _cycle(agent, lat):
    from jobqueue import lifecycle, states

    t = time.perf_counter()
    grant = lifecycle.claim_next_job(agent)
    if grant is None:
        raise SystemExit(f"fairness: {agent.name} claimed nothing")
    lifecycle.report_status(grant.job.id, grant.claim_id, states.SUCCESSFUL,
                            job_agent_id=agent.id)
    lat.append(time.perf_counter() - t)
    return grant.job.fairness_key


def run():
    from jobqueue import lifecycle
    from jobqueue.lifecycle import fairness

    jobs, claims = conf("BENCH_FAIRNESS_JOBS"), conf("BENCH_FAIRNESS_CLAIMS")
    reset_tables()
    ws_f, agent_f = _setup("fair")
    ws_p, agent_p = _setup("plain")
    for key, weight in WEIGHTS.items():
        if weight != 1:
            fairness.set_weight(ws_f.id, key, weight)
    t = time.perf_counter()
    for key in WEIGHTS:
        for _ in range(jobs):
            lifecycle.create_job(workspace=ws_f, job_agent=agent_f, fairness_key=key)
            lifecycle.create_job(workspace=ws_p, job_agent=agent_p)
    sql("VACUUM ANALYZE job")
    log(f"fairness: {3 * jobs:,} jobs each created ({time.perf_counter() - t:.0f}s)")
    for _ in range(50):  # warm both connections' plans (a's head, plain jobs)
        _cycle(agent_f, [])
        _cycle(agent_p, [])
    fair, plain, keys = [], [], []
    for _ in range(claims):
        keys.append(_cycle(agent_f, fair))
        _cycle(agent_p, plain)
    counts = collections.Counter(keys)
    total = sum(WEIGHTS.values())
    shares = {k: counts[k] / claims for k in WEIGHTS}
    expected = {k: w / total for k, w in WEIGHTS.items()}
    out = {
        "jobs": jobs, "claims": claims, "counts": dict(counts), "shares": shares,
        "off": max(abs(shares[k] - expected[k]) / expected[k] for k in WEIGHTS),
        "fair": {"per_s": len(fair) / sum(fair), "p50_ms": 1000 * percentile(fair, 50)},
        "plain": {"per_s": len(plain) / sum(plain), "p50_ms": 1000 * percentile(plain, 50)},
    }
    out["ratio"] = out["fair"]["per_s"] / out["plain"]["per_s"]
    log(f"fairness: {out}")
    return out


def table(res):
    c, f, p = res["counts"], res["fair"], res["plain"]
    return [
        f"{res['claims']:,} claim-next + report cycles on each of two queues, alternating: one "
        f"of {3 * res['jobs']:,} jobs over fairness keys `a`, `b` (weight 1) and `heavy` "
        f"(weight 2), created in that order ({res['jobs']:,} each), and one of as many jobs "
        "without keys (`python -m benchmarks.run fairness`).",
        "",
        "| key | weight | claimed | share | target |",
        "|---|---:|---:|---:|---:|",
        *(f"| {k} | {w} | {c.get(k, 0):,} | {100 * res['shares'][k]:.1f} % | "
          f"{100 * w / sum(WEIGHTS.values()):.0f} % |" for k, w in WEIGHTS.items()),
        "",
        f"Largest share off its target: {100 * res['off']:.1f} % of it (target <= 5 %). "
        f"Throughput: {f['per_s']:.0f} cycles/s with keys, {p['per_s']:.0f} without "
        f"(**{res['ratio']:.2f}x**, target >= 0.9x); cycle p50 {f['p50_ms']:.2f} / "
        f"{p['p50_ms']:.2f} ms.",
    ]
