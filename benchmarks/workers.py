"""Worker processes of the benchmark suite (run with the app's virtualenv).

    python -m benchmarks.workers core AGENT_ID BATCH [ACK]    # lifecycle claim-next + report(s)
    python -m benchmarks.workers raw_shape AGENT_ID           # same statements, raw psycopg
    python -m benchmarks.workers raw_cte AGENT_ID SQL_FILE    # the lifecycle's SQL, raw psycopg
    python -m benchmarks.workers heartbeat AGENT_ID FILE MODE ROUNDS   # MODE single|batch
    python -m benchmarks.workers http_agent BASE AGENT_ID TOKEN
    python -m benchmarks.workers http_trivial BASE TOKEN COUNT

DATABASE_URL names the database. Each prints `ready`, waits for a line, works, prints JSON.
"""

from __future__ import annotations

import os
import sys
import time
import uuid

from benchmarks.common import worker_done, worker_ready


def _django():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()


def _queued_left(agent_id) -> bool:
    from jobqueue import states
    from jobqueue.models import Job

    return Job.objects.filter(job_agent_id=agent_id, status=states.QUEUED).exists()


def core(agent_id: str, batch: str = "1", ack: str = "single") -> None:
    """Drain through the project's lifecycle: claim-next (or a batch), then a terminal
    report per job (ack=single) or one batch report for the batch (ack=batch), each in its
    own transaction as the HTTP edge would do it. ack=pipelined: a second thread (with its
    own connection) sends the batch reports while this one claims the next batch, as the
    reference agent's reporter thread does beside its claim loop."""
    _django()
    from jobqueue import lifecycle, states
    from jobqueue.models import JobAgent

    agent = JobAgent.objects.get(id=agent_id)
    batch = int(batch)
    if ack == "pipelined":
        return _core_pipelined(agent, batch)
    worker_ready()
    t0 = time.time()
    n = 0
    while True:
        grants = lifecycle.claim_next_jobs(agent, batch)
        if not grants:
            if _queued_left(agent.id):
                continue
            break
        if ack == "batch":
            out = lifecycle.report_many(agent.id, [
                lifecycle.ReportItem(g.job.id, g.claim_id, states.SUCCESSFUL) for g in grants
            ])
            if not all(r.accepted for r in out.results):
                raise RuntimeError(f"batch report refused: {out.results}")
            n += len(grants)
            continue
        for g in grants:
            lifecycle.report_status(g.job.id, g.claim_id, states.SUCCESSFUL, job_agent_id=agent.id)
            n += 1
    worker_done(n=n, t0=t0, t1=time.time())


def _core_pipelined(agent, batch: int) -> None:
    import queue
    import threading

    from django.db import connection

    from jobqueue import lifecycle, states

    handoff: queue.Queue = queue.Queue(maxsize=2)
    done = {"n": 0, "error": None}

    def reporter():
        try:
            while (grants := handoff.get()) is not None:
                out = lifecycle.report_many(agent.id, [
                    lifecycle.ReportItem(g.job.id, g.claim_id, states.SUCCESSFUL)
                    for g in grants
                ])
                if not all(r.accepted for r in out.results):
                    raise RuntimeError(f"batch report refused: {out.results}")
                done["n"] += len(grants)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            done["error"] = exc
            while handoff.get() is not None:
                pass
        finally:
            connection.close()

    worker_ready()
    t0 = time.time()
    thread = threading.Thread(target=reporter)
    thread.start()
    while done["error"] is None:
        grants = lifecycle.claim_next_jobs(agent, batch)
        if grants:
            handoff.put(grants)
        elif not _queued_left(agent.id):
            break
    handoff.put(None)
    thread.join()
    if done["error"] is not None:
        raise done["error"]
    worker_done(n=done["n"], t0=t0, t1=time.time())


# The statements the lifecycle sends for one claim-next and one terminal report (captured
# with CaptureQueriesContext), replayed by hand with psycopg: same SQL shape, no Django. The
# claim keeps to the claim rule (claimrule.py), so that it reads the claim index as the ORM does.
RAW_CLAIM = [
    "SELECT id, workspace_id, job_agent_id, status, job_agent_config, dispatch_context, result, "
    "message, external_id, attempt, max_attempts, initial_max_attempts, priority, available_at, "
    "idempotency_key, idempotency_fingerprint, last_claim_id, created_at, started_at, "
    "completed_at, updated_at, STATEMENT_TIMESTAMP() FROM job WHERE job_agent_id = %s "
    "AND available_at <= STATEMENT_TIMESTAMP() AND status = 'queued' "
    "AND concurrency_held IS NULL AND rate_held IS NULL "
    "ORDER BY priority DESC, COALESCE(fair_at, available_at), created_at "
    "LIMIT 1 FOR UPDATE OF job SKIP LOCKED",
    "UPDATE job SET status = 'in_progress', attempt = attempt + 1, last_claim_id = %s, "
    "started_at = %s, updated_at = %s WHERE id IN (%s) AND status = 'queued'",
    "INSERT INTO job_claim (job_id, job_agent_id, claim_id, attempt, lease_seconds, claimed_at, "
    "claim_expires_at, heartbeat_at) VALUES (%s, %s, %s, %s, 60, %s, %s, NULL) "
    "RETURNING claimed_at",
    "INSERT INTO job_event (job_id, kind, attempt, actor, claim_id, detail, created_at) "
    "VALUES (%s, 'claimed', %s, %s, %s, '{\"lease_seconds\": 60}'::jsonb, DEFAULT) "
    "RETURNING id, created_at",
]
RAW_REPORT = [
    "UPDATE job SET status = 'successful', completed_at = STATEMENT_TIMESTAMP(), "
    "updated_at = STATEMENT_TIMESTAMP() WHERE job_agent_id = %s AND id = %s "
    "AND last_claim_id = %s AND status = 'in_progress'",
    "DELETE FROM job_claim WHERE claim_id = %s AND job_id = %s",
    "SELECT id, workspace_id, job_agent_id, status, job_agent_config, dispatch_context, result, "
    "message, external_id, attempt, max_attempts, initial_max_attempts, priority, available_at, "
    "idempotency_key, idempotency_fingerprint, last_claim_id, created_at, started_at, "
    "completed_at, updated_at FROM job WHERE id = %s LIMIT 21",
    "INSERT INTO job_event (job_id, kind, attempt, actor, claim_id, detail, created_at) "
    "VALUES (%s, 'status_reported', %s, %s, %s, "
    "'{\"status\": \"successful\", \"has_result\": false}'::jsonb, DEFAULT) "
    "RETURNING id, created_at",
]


def raw_shape(agent_id: str) -> None:
    import datetime as dt

    import psycopg

    conn = psycopg.connect(os.environ["DATABASE_URL"])
    agent = uuid.UUID(agent_id)
    actor = f"agent:{agent}"
    worker_ready()
    t0 = time.time()
    n = 0
    while True:
        with conn.transaction():
            row = conn.execute(RAW_CLAIM[0], [agent]).fetchone()
            if row is not None:
                job_id, attempt, now = row[0], row[9] + 1, row[-1]
                claim_id = uuid.uuid4()
                conn.execute(RAW_CLAIM[1], [claim_id, now, now, job_id])
                conn.execute(
                    RAW_CLAIM[2],
                    [job_id, agent, claim_id, attempt, now, now + dt.timedelta(seconds=60)],
                )
                conn.execute(RAW_CLAIM[3], [job_id, attempt, actor, claim_id])
        if row is None:
            if conn.execute(
                "SELECT 1 FROM job WHERE job_agent_id = %s AND status = 'queued' LIMIT 1",
                [agent],
            ).fetchone():
                conn.commit()
                continue
            conn.commit()
            break
        with conn.transaction():
            cur = conn.execute(RAW_REPORT[0], [agent, job_id, claim_id])
            assert cur.rowcount == 1
            conn.execute(RAW_REPORT[1], [claim_id, job_id])
            conn.execute(RAW_REPORT[2], [job_id]).fetchone()
            conn.execute(RAW_REPORT[3], [job_id, attempt, actor, claim_id])
        n += 1
    worker_done(n=n, t0=t0, t1=time.time())


def raw_cte(agent_id: str, sql_file: str) -> None:
    """The lifecycle's own PostgreSQL statements (claim-next, terminal report scoped to the
    agent), written to `sql_file` by benchmarks.scenarios.drains from jobqueue.lifecycle, run
    by a plain psycopg loop without Django: the same SQL shape, one statement per phase."""
    import json

    import psycopg

    with open(sql_file) as fh:
        sql = json.load(fh)
    conn = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True)
    agent = uuid.UUID(agent_id)
    actor = f"agent:{agent}"
    claim_params = {"agent": agent, "actor": actor, "limit": 1, "lease": 60, "kind": "claimed",
                    "holder": "", "key": None}
    report_params = {"agent": agent, "workspace": None, "actor": actor,
                     "kind": "status_reported", "status": "successful", "message": None,
                     "result": None, "external_id": None,
                     "detail": '{"status": "successful", "has_result": false}'}
    at = None
    worker_ready()
    t0 = time.time()
    n = 0
    while True:
        cur = conn.execute(sql["claim"], claim_params)
        row = cur.fetchone()
        if row is None:
            if conn.execute(
                "SELECT 1 FROM job WHERE job_agent_id = %s AND status = 'queued' LIMIT 1",
                [agent],
            ).fetchone():
                continue
            break
        if at is None:  # where id and last_claim_id are (read once, not per statement)
            names = [c.name for c in cur.description]
            at = names.index("id"), names.index("last_claim_id")
        done = conn.execute(
            sql["report"], {**report_params, "job": row[at[0]], "claim": row[at[1]]}
        ).fetchone()
        assert done is not None and done[-1] == 1
        n += 1
    worker_done(n=n, t0=t0, t1=time.time())


def heartbeat(agent_id: str, claims_file: str, mode: str, rounds: str) -> None:
    """Renew this worker's share of live claims `rounds` times, one by one or in batches."""
    _django()
    from jobqueue import lifecycle

    agent_id = uuid.UUID(agent_id)
    with open(claims_file) as fh:
        pairs = [lifecycle.ClaimRef(*map(uuid.UUID, line.split())) for line in fh if line.strip()]
    batch = 100
    worker_ready()
    t0 = time.time()
    n = refused = 0
    for _ in range(int(rounds)):
        if mode == "single":
            for job_id, claim_id in pairs:
                lifecycle.heartbeat(job_id, claim_id, job_agent_id=agent_id)
                n += 1
        else:
            for i in range(0, len(pairs), batch):
                out = lifecycle.heartbeat_many(agent_id, pairs[i : i + batch])
                ok = sum(1 for r in out.results if r.renewed)
                n += ok
                refused += len(out.results) - ok
    worker_done(n=n, refused=refused, t0=t0, t1=time.time())


def http_agent(base: str, agent_id: str, token: str) -> None:
    """One agent: claim-next, one heartbeat, a terminal report, until nothing is left."""
    import httpx

    client = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"},
                          timeout=30)
    lat = {"claim": [], "heartbeat": [], "status": []}
    errors = 0
    worker_ready()
    t0 = time.time()
    n = 0
    while True:
        s = time.perf_counter()
        r = client.post(f"job-agents/{agent_id}/jobs/claim", json={})
        lat["claim"].append(time.perf_counter() - s)
        if r.status_code == 204:
            break
        if r.status_code != 200:
            errors += 1
            if errors > 50:
                raise RuntimeError(f"claim: {r.status_code} {r.text[:300]}")
            continue
        body = r.json()
        job_id, claim_id = body["job"]["id"], body["claim"]["claim_id"]
        s = time.perf_counter()
        r = client.post(f"jobs/{job_id}/heartbeat", json={"claim_id": claim_id})
        lat["heartbeat"].append(time.perf_counter() - s)
        if r.status_code != 200:
            raise RuntimeError(f"heartbeat: {r.status_code} {r.text[:300]}")
        s = time.perf_counter()
        r = client.put(f"jobs/{job_id}/status", json={"claim_id": claim_id, "status": "successful"})
        lat["status"].append(time.perf_counter() - s)
        if r.status_code != 200:
            raise RuntimeError(f"status: {r.status_code} {r.text[:300]}")
        n += 1
    worker_done(n=n, t0=t0, t1=time.time(), lat=lat, errors=errors)


def http_cycle(base: str, agent_id: str, token: str, path: str) -> None:
    """One agent drains its jobs over the API on one path (benchmarks.wal): `single`,
    claim-next and PUT status per job; `batch`, a batch claim of 10 and one batch report."""
    import httpx

    client = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"},
                          timeout=30)
    worker_ready()
    t0 = time.time()
    n = 0
    while True:
        if path == "single":
            r = client.post(f"job-agents/{agent_id}/jobs/claim", json={})
            if r.status_code == 204:
                break
            r.raise_for_status()
            body = r.json()
            r = client.put(f"jobs/{body['job']['id']}/status",
                           json={"claim_id": body["claim"]["claim_id"], "status": "successful"})
            r.raise_for_status()
            n += 1
            continue
        r = client.post(f"job-agents/{agent_id}/jobs/claim", json={"limit": 10})
        r.raise_for_status()
        claims = r.json()["claims"]
        if not claims:
            break
        r = client.post(f"job-agents/{agent_id}/reports", json={"reports": [
            {"job_id": c["job"]["id"], "claim_id": c["claim"]["claim_id"],
             "status": "successful"} for c in claims]})
        r.raise_for_status()
        n += len(claims)
    worker_done(n=n, t0=t0, t1=time.time())


def http_trivial(base: str, token: str, count: str) -> None:
    import httpx

    client = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"},
                          timeout=30)
    lat = []
    worker_ready()
    t0 = time.time()
    for _ in range(int(count)):
        s = time.perf_counter()
        r = client.get("bench/trivial/")
        lat.append(time.perf_counter() - s)
        if r.status_code != 200:
            raise RuntimeError(f"trivial: {r.status_code} {r.text[:300]}")
    worker_done(n=int(count), t0=t0, t1=time.time(), lat={"trivial": lat})


if __name__ == "__main__":
    kind, *args = sys.argv[1:]
    {
        "core": core,
        "raw_shape": raw_shape,
        "raw_cte": raw_cte,
        "heartbeat": heartbeat,
        "http_agent": http_agent,
        "http_cycle": http_cycle,
        "http_trivial": http_trivial,
    }[kind](*args)
