"""Deployment behind PgBouncer in transaction pooling mode (Debian's 1.18: no prepared
statements there), with JOBQUEUE_PREPARED_STATEMENTS=0: two API replicas (gunicorn) share
one PostgreSQL through one PgBouncer; real agents on both drain the queue; no request gets a
5xx; and with PgBouncer restarted mid-run, nothing is lost and the only 5xx are 503s
(database_unavailable, retried by the agents) for requests whose connection PgBouncer closed
under them; never a 500. The PgBouncer is the test's own
(tests/e2e/pgbouncer.py), in front of the test database."""

import collections
import re
import threading
import time

import httpx
import pytest
from django.db import connection

from agents import credentials
from jobqueue import lifecycle, sql, states
from jobqueue.lifecycle.pg import claim_statement, functions
from jobqueue.models import Job, JobClaim
from tests.factories import JobAgentFactory, JobFactory
from tests.utils import statements_sent

from .harness import Stack, audit, free_port, wait_for
from .pgbouncer import PrivateBouncer

pytestmark = [pytest.mark.e2e, pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]

STATUS = re.compile(r'" (\d{3}) ')


@pytest.fixture
def bouncer(transactional_db):
    d = connection.settings_dict
    b = PrivateBouncer(d.get("HOST") or "127.0.0.1", int(d.get("PORT") or 5432),
                        d["NAME"]).start()
    try:
        yield b
    finally:
        b.close()


@pytest.fixture
def replicas(bouncer, tmp_path):
    """A stack whose servers, agents and reaper reach the database through PgBouncer, with
    two API replicas, each logging every request's status."""
    d = connection.settings_dict
    direct = (f"postgres://{d.get('USER') or 'postgres'}@{d.get('HOST') or '127.0.0.1'}:"
              f"{d.get('PORT') or 5432}/{d['NAME']}")
    # The long-poll listeners need a session (LISTEN): a direct connection, as documented.
    # The re-check (a waiter's safety net when a wake-up is lost) is pushed out of the way, so
    # that a held claim answered quickly was woken by a NOTIFY.
    stack = Stack(tmp_path, db_url=bouncer.url(d["NAME"]),
                  server_env={"JOBQUEUE_PREPARED_STATEMENTS": "0",
                              "DATABASE_CONNECT_RETRY_SECONDS": "5",
                              "JOBQUEUE_LISTEN_DATABASE_URL": direct,
                              "JOBQUEUE_WAIT_RECHECK_SECONDS": "60"})
    try:
        ports = [stack.port, free_port()]
        logs = [tmp_path / f"access-{i}.log" for i in range(2)]
        servers = [stack.start_replica(p, access_log=log)
                   for p, log in zip(ports, logs, strict=True)]
        stack.server = servers[0]
        yield stack, servers, [f"http://127.0.0.1:{p}" for p in ports], logs
    finally:
        stack.close()


def statuses(logs) -> list[list[int]]:
    return [[int(m[1]) for m in STATUS.finditer(log.read_text())] for log in logs]


def run_fleet(stack, urls, make_agent, make_jobs, n_jobs):
    agent, token = make_agent(lease_seconds=5, max_attempts=10, name="bounced")
    jobs = make_jobs(agent, n_jobs, stack.command("true"))
    stack.start_reaper(interval=0.5)
    agents = [stack.start_agent(agent, token, f"{name}", concurrency=2, server_url=url)
              for name, url in (("A", urls[0]), ("B", urls[1]), ("C", urls[0]), ("D", urls[1]))]
    return [j.id for j in jobs], agents


def finished(ids) -> int:
    return Job.objects.filter(id__in=ids, status__in=states.TERMINAL).count()


def check_all_done_once(ids):
    report = audit(ids)
    assert report["violations"] == []
    assert report["terminal_not_once"] == {}
    assert report["statuses"] == {states.SUCCESSFUL: len(ids)}
    assert not JobClaim.objects.filter(job_id__in=ids).exists()


def test_two_replicas_through_pgbouncer_drain_the_queue_without_a_5xx(
        bouncer, replicas, make_agent, make_jobs, say):
    stack, servers, urls, logs = replicas
    ids, agents = run_fleet(stack, urls, make_agent, make_jobs, 200)
    t0 = time.monotonic()
    wait_for(lambda: finished(ids) == len(ids), 180, "every job to end", on_fail=stack.logs)
    took = time.monotonic() - t0
    check_all_done_once(ids)
    assert [a.stop() for a in agents] == [0, 0, 0, 0]
    per_replica = statuses(logs)
    # Both replicas served the agents, and nothing got a 5xx.
    assert all(len(codes) > 50 for codes in per_replica), [len(c) for c in per_replica]
    assert [c for codes in per_replica for c in codes if c >= 500] == []
    # The work went through PgBouncer, in transaction pooling (its stats count it).
    stats = {row[0]: row for row in bouncer.show("STATS")}
    assert connection.settings_dict["NAME"] in stats
    assert all(s.alive() for s in servers)
    say(f"pgbouncer: {len(ids)} jobs by 4 agents over 2 replicas in {took:.1f}s, "
        f"{sum(map(len, per_replica))} requests, no 5xx")


def test_a_long_poll_wake_up_crosses_replicas_through_pgbouncer(bouncer, replicas, make_agent,
                                                                 say):
    """An agent's claim held on replica B is answered by a job created through replica A (its
    NOTIFY sent on a pooled connection, in the create's transaction), and a producer's wait on
    B for that job's end by the agent's report through A; each well before the re-check (60 s)
    or the wait (30 s) would have answered."""
    stack, servers, urls, logs = replicas
    agent, token = make_agent(lease_seconds=30, name="crossing")
    key = credentials.issue_workspace_api_key(agent.workspace)
    ws = f"/v1/workspaces/{agent.workspace_id}"
    agent_auth = {"Authorization": f"Bearer {token}"}
    producer_auth = {"X-API-Key": key}
    held: dict = {}

    def hold_claim():
        started = time.monotonic()
        r = httpx.post(f"{urls[1]}{ws}/job-agents/{agent.id}/jobs/claim",
                       json={"wait_seconds": 30}, headers=agent_auth, timeout=40)
        held.update(status=r.status_code, body=r.json() if r.content else None,
                    answered=time.monotonic(), took=time.monotonic() - started)

    waiter = threading.Thread(target=hold_claim)
    waiter.start()
    time.sleep(1.5)  # the claim is held on B
    assert "status" not in held
    created = time.monotonic()
    r = httpx.post(f"{urls[0]}{ws}/jobs", headers=producer_auth, timeout=10,
                   json={"job_agent_id": str(agent.id), "job_agent_config": {"n": 1}})
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    waiter.join(40)
    assert held["status"] == 200, held
    assert held["body"]["job"]["id"] == job_id
    pickup = held["answered"] - created
    assert pickup < 5, pickup

    ended: dict = {}

    def wait_for_end():
        r = httpx.get(f"{urls[1]}{ws}/jobs/{job_id}", params={"wait_seconds": 30},
                      headers=producer_auth, timeout=40)
        ended.update(status=r.status_code, job=r.json(), answered=time.monotonic())

    producer = threading.Thread(target=wait_for_end)
    producer.start()
    time.sleep(1.5)  # the producer's wait is held on B
    assert "status" not in ended
    reported = time.monotonic()
    claim_id = held["body"]["claim"]["claim_id"]
    r = httpx.put(f"{urls[0]}{ws}/jobs/{job_id}/status", headers=agent_auth, timeout=10,
                  json={"claim_id": claim_id, "status": "successful"})
    assert r.status_code == 200, r.text
    producer.join(40)
    assert (ended["status"], ended["job"]["status"]) == (200, states.SUCCESSFUL)
    woken = ended["answered"] - reported
    assert woken < 5, woken
    codes = [c for per in statuses(logs) for c in per]
    assert [c for c in codes if c >= 500] == []
    say(f"pgbouncer, across replicas: claim held on B picked up {pickup * 1000:.0f} ms after "
        f"the create on A; a producer's wait on B woken {woken * 1000:.0f} ms after the report "
        "on A")


def test_pgbouncer_restarted_mid_run_loses_nothing(bouncer, replicas, make_agent, make_jobs,
                                                   say):
    stack, servers, urls, logs = replicas
    ids, agents = run_fleet(stack, urls, make_agent, make_jobs, 200)
    wait_for(lambda: finished(ids) >= 40, 120, "work to be under way", on_fail=stack.logs)
    down = bouncer.restart()
    assert finished(ids) < len(ids), "the restart should hit a queue with work left"
    wait_for(lambda: finished(ids) == len(ids), 180, "every job to end after the restart",
             on_fail=lambda: stack.logs() + bouncer.log())
    check_all_done_once(ids)
    assert [a.stop() for a in agents] == [0, 0, 0, 0]
    assert all(s.alive() for s in servers)
    codes = [c for per in statuses(logs) for c in per]
    errors = sorted(c for c in codes if c >= 500)
    say(f"pgbouncer restart: down {down:.2f}s; {len(codes)} requests, 5xx: {errors}")
    # New connections ride out the restart (DATABASE_CONNECT_RETRY_SECONDS): no request fails
    # for want of a connection. What is left is a request whose statement went out on a
    # connection PgBouncer closed as it shut down: never retried (whether it took effect is
    # unknown), a 503 database_unavailable the agent retries, never a 500. At most one per
    # connection open then.
    server_log = "".join(s.output() for s in servers)
    assert "Connection refused" not in server_log
    assert "Internal Server Error" not in server_log
    lost = server_log.count("server closed the connection unexpectedly")
    # Every 503 is such a request; a lost connection may also be a background query's (the
    # long-poll re-check), which answers nobody.
    assert len(errors) == server_log.count("answered 503") <= lost
    assert set(errors) <= {503} and len(errors) <= 2 * 2 * 8  # replicas x workers x threads


def test_pgbouncer_restarted_online_mid_run_fails_no_request(bouncer, replicas, make_agent,
                                                             make_jobs, say):
    """`pgbouncer -R`, the restart that keeps the connections (docs/deploying.md): not one
    request of the run answers 5xx, and nothing is lost or run twice."""
    stack, servers, urls, logs = replicas
    ids, agents = run_fleet(stack, urls, make_agent, make_jobs, 200)
    wait_for(lambda: finished(ids) >= 40, 120, "work to be under way", on_fail=stack.logs)
    took = bouncer.restart_online()
    assert finished(ids) < len(ids), "the restart should hit a queue with work left"
    assert "old process killed, resuming work" in bouncer.log()
    wait_for(lambda: finished(ids) == len(ids), 180, "every job to end after the restart",
             on_fail=lambda: stack.logs() + bouncer.log())
    check_all_done_once(ids)
    assert [a.stop() for a in agents] == [0, 0, 0, 0]
    codes = [c for per in statuses(logs) for c in per]
    say(f"pgbouncer online restart: {took:.2f}s; {len(codes)} requests, "
        f"5xx: {sorted(c for c in codes if c >= 500)}")
    assert [c for c in codes if c >= 500] == []


def test_the_core_cycle_through_pgbouncer_next_to_direct(bouncer, settings, say):
    """The claim + report cycle in this process: direct (prepared statements) and through
    PgBouncer (JOBQUEUE_PREPARED_STATEMENTS=0, as a pooled deployment runs it: the hot
    statements' PL/pgSQL wrappers, which the migrations installed). It prints the rates; the
    target (≥ 0.8× direct) is the benchmark suite's (`make bench BENCH_ARGS=pgbouncer`)."""
    n = 300

    def cycle_rate() -> float:
        agent = JobAgentFactory()
        for _ in range(n):
            JobFactory(job_agent=agent)
        t0 = time.perf_counter()
        for _ in range(n):
            grant = lifecycle.claim_next_job(agent)
            lifecycle.report_status(grant.job.id, grant.claim_id, states.SUCCESSFUL)
        return n / (time.perf_counter() - t0)

    direct = cycle_rate()
    saved = dict(connection.settings_dict)
    settings.JOBQUEUE = {**settings.JOBQUEUE, "PREPARED_STATEMENTS": False}
    try:
        connection.close()
        connection.settings_dict.update(HOST="127.0.0.1", PORT=bouncer.port,
                                        PASSWORD=bouncer.password)
        with statements_sent() as sent:
            pooled = cycle_rate()
        with connection.cursor() as cur:  # nothing was prepared on the pooled connection
            cur.execute("SELECT count(*) FROM pg_prepared_statements")
            assert cur.fetchone()[0] == 0
        # The claims and reports went as calls of their wrappers.
        calls = {functions.call(name, text): text for name, text in
                 functions.wrapped().items()}
        ran = collections.Counter(calls[text] for text, _ in sent if text in calls)
        assert ran == {claim_statement(1): n, sql.postgresql.job_set_state_if_running: n}
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(saved)
    assert pooled > 0 and direct > 0
    say(f"core cycle (claim + report, one caller): direct {direct:.0f}/s, "
        f"through pgbouncer unprepared {pooled:.0f}/s ({pooled / direct:.2f}x)")
