"""The `pickup` scenario (long-poll): latency from POST jobs to the waiting agent holding
the claim with BENCH_PICKUP_AGENTS idle waiting agents, next to a polling agent (idle backoff
up to 5 s), the database's transactions per second while they wait on an empty queue, and
another agent's heartbeat latency while 200 claims wait.
"""

from __future__ import annotations

import math
import signal
import time

from benchmarks.common import log, percentile
from benchmarks.project import (
    make_agent,
    reset_tables,
    retry,
    sql,
)
from benchmarks.servers import start_gunicorn
from benchmarks.sizes import conf

TITLE = "Pickup (long-poll)"


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


def run():
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


def table(res):
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
