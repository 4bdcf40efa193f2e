"""The `growth` scenario: claim-next latency with BENCH_GROWTH_SMALL vs BENCH_GROWTH_LARGE
finished jobs in the table; the agent poll's latency with BENCH_POLL_QUEUED queued jobs.
"""

from __future__ import annotations

import time

from benchmarks.common import log, percentile
from benchmarks.project import (
    insert_jobs,
    make_agent,
    reset_tables,
    sql,
)
from benchmarks.sizes import conf

TITLE = "Growth"


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
    from agents.serializers.job_agents import LIST_ITEM_FIELDS
    from jobqueue.models import Job

    lat = []
    for _ in range(samples):
        t = time.perf_counter()
        rows = list(
            Job.objects.filter(job_agent_id=agent.id).claimable().in_claim_order()
            .only(*LIST_ITEM_FIELDS)[:101]
        )
        lat.append(time.perf_counter() - t)
        assert len(rows) == 101
    return lat


def run():
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
    from benchmarks.project import report_counts
    from jobqueue.models import Job, JobClaim

    if JobClaim.objects.exists():
        raise SystemExit("growth: claims left")
    if report_counts(Job.objects.exclude(status="cancelled")) != (2 * samples, 2 * samples):
        raise SystemExit("growth: each sampled job must be reported exactly once")
    out["sizes"] = [small, large]
    return out


def table(res):
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
