"""The HTTP cost as an outside client sees it (#16): `python -m benchmarks.http_outside`.

A plain urllib client (a new connection per request, no keep-alive, no client library) with
8 threads against `gunicorn -c config/gunicorn.conf.py` with 2 workers on PostgreSQL. Each
round runs two phases of 8 threads: agents looping claim-next → heartbeat → terminal report,
then the trivial authenticated endpoint (`/bench/trivial/`, benchmarks/bench_urls.py: the
same token authentication and throttle, one read). Prints each round's p50 per request and
its ratio to the trivial endpoint's p50 of the same round. `HTTP_OUTSIDE_ROUNDS` (5),
`HTTP_OUTSIDE_CYCLES` (100 per thread and round), `HTTP_OUTSIDE_WORKERS` (2). The database is
`<BENCH_DATABASE_URL's name>_core` (benchmarks.common), re-created.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
import urllib.request

from benchmarks import project
from benchmarks.servers import start_gunicorn

THREADS = 8


def main() -> None:
    rounds = int(os.environ.get("HTTP_OUTSIDE_ROUNDS", 5))
    cycles = int(os.environ.get("HTTP_OUTSIDE_CYCLES", 100))
    project.migrate()
    project.setup_django()
    from agents import credentials

    agent = project.make_agent()
    token = credentials.issue_agent_token(agent)
    project.insert_jobs(agent, THREADS * cycles * rounds)
    project.sql("ANALYZE job")
    proc, port = start_gunicorn(int(os.environ.get("HTTP_OUTSIDE_WORKERS", 2)))
    root = f"http://127.0.0.1:{port}"
    base = f"{root}/v1/workspaces/{agent.workspace_id}/"
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def call(method, url, body=None):
        data = json.dumps(body).encode() if body is not None else None
        started = time.perf_counter()
        with urllib.request.urlopen(urllib.request.Request(url, data, headers,
                                                           method=method)) as answer:
            content = answer.read()
        return time.perf_counter() - started, content

    def agent_loop(lat):
        for _ in range(cycles):
            took, content = call("POST", f"{base}job-agents/{agent.id}/jobs/claim", {})
            lat["claim"].append(took)
            body = json.loads(content)
            job, claim = body["job"]["id"], body["claim"]["claim_id"]
            lat["heartbeat"].append(call("POST", f"{base}jobs/{job}/heartbeat",
                                         {"claim_id": claim})[0])
            lat["report"].append(call("PUT", f"{base}jobs/{job}/status",
                                      {"claim_id": claim, "status": "successful"})[0])

    def trivial_loop(lat):
        for _ in range(3 * cycles):
            lat["trivial"].append(call("GET", f"{root}/bench/trivial/")[0])

    def phase(loop):
        lat = {"claim": [], "heartbeat": [], "report": [], "trivial": []}
        threads = [threading.Thread(target=loop, args=(lat,)) for _ in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return lat

    try:
        phase(trivial_loop)  # every worker and thread warm
        ratios = {"claim": [], "heartbeat": [], "report": []}
        for n in range(rounds):
            agents, trivial = phase(agent_loop), phase(trivial_loop)
            base_p50 = statistics.median(trivial["trivial"])
            parts = []
            for kind in ratios:
                p50 = statistics.median(agents[kind])
                ratios[kind].append(p50 / base_p50)
                parts.append(f"{kind} {1000 * p50:.2f} ms ({p50 / base_p50:.2f}x)")
            print(f"round {n + 1}: trivial {1000 * base_p50:.2f} ms; " + ", ".join(parts),
                  flush=True)
        print("median ratio: " + ", ".join(f"{k} {statistics.median(v):.2f}x"
                                           for k, v in ratios.items()))
        project.verify_drained(agent, THREADS * cycles * rounds)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
