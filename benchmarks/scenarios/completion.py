"""The `completion` scenario: benchmarks/completion.py (in its own process and database):
the outbox's cost per job (one webhook endpoint), the webhook sender's deliveries/s, and
pruning BENCH_PRUNE_JOBS finished jobs: jobs/s, and another agent's cycle latency before and
while it runs.
"""

from __future__ import annotations

import json
import os
import subprocess

from benchmarks.common import ROOT
from benchmarks.project import (
    APP_PY,
)
from benchmarks.sizes import conf

TITLE = "Completion: outbox, webhook sender, pruning"


def run():
    """benchmarks/completion.py in its own process (it sets Django up on its own database)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           **{k: str(conf(k)) for k in ("BENCH_OUTBOX_JOBS", "BENCH_OUTBOX_REPS",
                                        "BENCH_PRUNE_JOBS")}}
    env.pop("DATABASE_URL", None)
    out = subprocess.run([APP_PY, "-m", "benchmarks.completion"], cwd=ROOT, env=env,
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def table(res):
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
