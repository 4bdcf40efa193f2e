"""The `reaper` scenario: the time one `reaper.sweep()` takes to requeue
BENCH_REAPER_CLAIMS expired claims, at each batch size of BENCH_REAPER_BATCHES.
"""

from __future__ import annotations

import time

from benchmarks.common import log
from benchmarks.project import (
    insert_jobs,
    make_agent,
    reset_tables,
    sql,
)
from benchmarks.sizes import conf

TITLE = "Reaper"


def run():
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


def table(res):
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
