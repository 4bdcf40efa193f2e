"""The `http` scenario: N agents (BENCH_HTTP_AGENTS) against gunicorn: claim-next, one
heartbeat, a terminal report; next to a trivial authenticated DRF endpoint that runs one
query.
"""

from __future__ import annotations

from benchmarks.common import log, median, percentile, run_workers, throughput
from benchmarks.project import (
    APP_PY,
    insert_jobs,
    make_agent,
    reset_tables,
    retry,
    sql,
    verify_drained,
)
from benchmarks.servers import start_gunicorn
from benchmarks.sizes import conf

TITLE = "HTTP cycle"


def run():
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


def table(res):
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
