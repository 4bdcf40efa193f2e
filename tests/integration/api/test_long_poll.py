"""Long-poll over HTTP: `wait_seconds` on claim-next (single and batch) and on a producer's
GET jobs/{id}. Bounds in-process; the held requests through the production server
(gunicorn -c config/gunicorn.conf.py, real processes): wake-ups, a client that hangs up,
heartbeats beside 200 held waits, SIGTERM."""

from __future__ import annotations

import gc
import json
import socket
import statistics
import threading
import time

import httpx
import pytest
from jobqueue_client import verify_fencing_token

from jobqueue import lifecycle, states
from jobqueue.models import Job, JobClaim, JobEvent
from tests.e2e.harness import Stack
from tests.factories import JobFactory
from tests.utils import database_now, wait_for, wait_until_claim_held

from .conftest import make_world

pytestmark = pytest.mark.usefixtures("wakeups_stopped_after")

BAD_WAITS = [-1, 51, "5", True, 1.5, None, [], 10**12]


def _state():
    return (
        sorted(Job.objects.values_list("id", "status", "attempt", "updated_at")),
        sorted(JobClaim.objects.values_list("job_id", "claim_expires_at")),
        JobEvent.objects.count(),
    )


def _is_400(r, secret=None):
    assert r.status_code == 400, (r.status_code, r.content)
    body = r.json()
    assert body["code"] == "validation_error" and body["detail"]
    assert "wait_seconds" in body.get("fields", {}) or "wait_seconds" in body["detail"]
    if secret is not None:
        assert secret not in r.content.decode()
    return body


@pytest.mark.django_db
@pytest.mark.parametrize("value", BAD_WAITS)
@pytest.mark.parametrize("limit", [None, 5, 500])  # 500: past the batch cap too
def test_claim_next_refuses_a_bad_wait_and_changes_nothing(world, value, limit):
    JobFactory(job_agent=world.agent)
    before = _state()
    body = {"wait_seconds": value} if limit is None else {"wait_seconds": value, "limit": limit}
    _is_400(world.agent_caller().post(f"job-agents/{world.agent.id}/jobs/claim", json=body))
    assert _state() == before


@pytest.mark.django_db
@pytest.mark.parametrize("value", ["-1", "51", "abc", "1.5", "", "1e3", "٣", "9" * 40])
def test_a_producer_wait_refuses_a_bad_value(world, value):
    job = JobFactory(job_agent=world.agent)
    before = _state()
    r = world.producer().get(f"jobs/{job.id}?wait_seconds={value}")
    _is_400(r, secret=value if len(value) > 3 else None)
    assert _state() == before


@pytest.mark.django_db
def test_wait_zero_is_a_plain_claim_and_a_plain_read(world):
    agent = world.agent_caller()
    assert agent.post(f"job-agents/{world.agent.id}/jobs/claim",
                      json={"wait_seconds": 0}).status_code == 204
    assert agent.post(f"job-agents/{world.agent.id}/jobs/claim",
                      json={"wait_seconds": 0, "limit": 3}).json() == {"claims": []}
    job = JobFactory(job_agent=world.agent)
    r = world.producer().get(f"jobs/{job.id}?wait_seconds=0")
    assert r.status_code == 200 and r.json()["status"] == states.QUEUED


@pytest.mark.django_db(transaction=True)
def test_waits_answer_at_their_deadline(world):
    agent = world.agent_caller()
    started = time.monotonic()
    r = agent.post(f"job-agents/{world.agent.id}/jobs/claim", json={"wait_seconds": 1})
    assert r.status_code == 204 and 1.0 <= time.monotonic() - started < 2.0
    started = time.monotonic()
    r = agent.post(f"job-agents/{world.agent.id}/jobs/claim",
                   json={"wait_seconds": 1, "limit": 2})
    assert r.json() == {"claims": []} and 1.0 <= time.monotonic() - started < 2.0
    job = JobFactory(job_agent=world.agent)
    started = time.monotonic()
    r = world.producer().get(f"jobs/{job.id}?wait_seconds=1")
    assert r.status_code == 200 and r.json()["status"] == states.QUEUED
    assert 1.0 <= time.monotonic() - started < 2.0


@pytest.mark.django_db(transaction=True)
def test_a_producer_wait_on_another_workspaces_job_is_a_404_at_once(world):
    foreign = JobFactory(job_agent=world.other_workspace_agent)
    started = time.monotonic()
    r = world.producer().get(f"jobs/{foreign.id}?wait_seconds=30")
    assert r.status_code == 404 and r.json()["code"] == "not_found"
    assert time.monotonic() - started < 1


@pytest.mark.django_db(transaction=True)
def test_an_agent_token_cannot_wait_on_another_agents_queue(world):
    started = time.monotonic()
    r = world.agent_caller().post(f"job-agents/{world.other_agent.id}/jobs/claim",
                                  json={"wait_seconds": 30})
    assert r.status_code == 404 and time.monotonic() - started < 1


# --- through the production server ------------------------------------------------------


@pytest.fixture
def server(transactional_db, tmp_path):
    # 2 workers x 240 threads, each thread keeping its connection for DATABASE_CONN_MAX_AGE,
    # can ask for more than the shared server's 100 connection slots after a burst of answered
    # waits (README: size CONN_MAX_AGE with the threads); these tests close them per request.
    stack = Stack(tmp_path, server_env={"JOBQUEUE_WAIT_RECHECK_SECONDS": 60,
                                        "DATABASE_CONN_MAX_AGE": "0"})
    stack.access_log = tmp_path / "access.log"
    stack.started_at = database_now()  # the server's listeners connect after this
    try:
        stack.start_server(workers=2, threads=240, access_log=stack.access_log)
        yield stack
    finally:
        stack.close()


def _claim_url(server, world):
    return f"{server.url}/v1/workspaces/{world.workspace.id}/job-agents/{world.agent.id}/jobs/claim"


def _held(server, world, wait: float):
    """A raw claim-next with wait_seconds on its own socket (not read yet)."""
    body = json.dumps({"wait_seconds": wait}).encode()
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(
        f"POST /v1/workspaces/{world.workspace.id}/job-agents/{world.agent.id}/jobs/claim "
        f"HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {world.token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    return sock


def _until_held(server, world) -> None:
    wait_until_claim_held(world.agent.id, server.started_at)


def _answer(sock, timeout=30) -> bytes:
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def test_a_held_claim_gets_a_job_posted_by_a_producer(server):
    world = make_world()
    headers = {"Authorization": f"Bearer {world.token}"}
    result = {}

    def wait():
        with httpx.Client(timeout=30) as http:
            r = http.post(_claim_url(server, world), json={"wait_seconds": 20}, headers=headers)
            result["r"], result["at"] = r, time.monotonic()

    waiter = threading.Thread(target=wait)
    waiter.start()
    _until_held(server, world)
    with httpx.Client(base_url=server.url, timeout=30,
                      headers={"X-API-Key": world.key}) as producer:
        posted = time.monotonic()
        created = producer.post(f"/v1/workspaces/{world.workspace.id}/jobs",
                                json={"job_agent_id": str(world.agent.id)})
        assert created.status_code == 201, created.text
        waiter.join(30)
        r = result["r"]
        assert r.status_code == 200 and r.json()["job"]["id"] == created.json()["id"]
        assert result["at"] - posted < 5.0  # the wake-up: the re-check is every 60 s here
        # The woken claim carries its fencing token, verifiable with the served key set.
        token = r.json()["claim"]["fencing_token"]
        claims = verify_fencing_token(token, producer.get("/v1/.well-known/jwks.json").json(),
                                      workspace_id=str(world.workspace.id))
        assert (claims.job_id, claims.attempt, claims.claim_id) == (
            created.json()["id"], 1, r.json()["claim"]["claim_id"])

        # the producer waits for the end, which the agent reports
        job_id, claim_id = r.json()["job"]["id"], r.json()["claim"]["claim_id"]
        ended = {}

        def producer_wait():
            with httpx.Client(timeout=30, headers={"X-API-Key": world.key}) as http:
                got = http.get(f"{server.url}/v1/workspaces/{world.workspace.id}/jobs/{job_id}",
                               params={"wait_seconds": 20})
                ended["r"], ended["at"] = got, time.monotonic()

        t = threading.Thread(target=producer_wait)
        t.start()
        # The producer's wait marks the job (job.watched, in the database) just before it
        # waits: the report then ends a job a producer waits for, and the answer within the
        # bound below is the wake-up's (the re-check is every 60 s, the wait 20 s).
        wait_for(lambda: Job.objects.filter(id=job_id, watched=True).exists(), 30,
                 "the producer's wait to mark the job")
        with httpx.Client(timeout=30, headers=headers) as agent:
            reported = time.monotonic()
            r = agent.put(f"{server.url}/v1/workspaces/{world.workspace.id}/jobs/{job_id}/status",
                          json={"claim_id": claim_id, "status": "successful"})
            assert r.status_code == 200, r.text
        t.join(30)
        assert ended["r"].status_code == 200 and ended["r"].json()["status"] == "successful"
        assert ended["at"] - reported < 5.0


def _claims_answered(server) -> list[str]:
    """The access log's lines of answered claim-next requests."""
    if not server.access_log.exists():
        return []
    return [line for line in server.access_log.read_text().splitlines()
            if "/jobs/claim " in line]


def test_a_client_that_hangs_up_during_a_wait_claims_nothing(server):
    world = make_world()
    sock = _held(server, world, 20)
    _until_held(server, world)
    sock.close()  # hangs up
    # Claimable in 1 s: not by the held request's first check, however late that runs (on
    # SQLite nothing outside the server shows it has run). The held request sees its
    # client gone (within 1 s, or at the job's wake-up) and ends: gunicorn logs it.
    job, _ = lifecycle.create_job(workspace=world.workspace, job_agent=world.agent,
                                  delay_seconds=1)
    [line] = wait_for(lambda: _claims_answered(server), 30, "the held claim to end")
    assert '" 204 ' in line, line  # answered nothing (to nobody)
    assert Job.objects.get(id=job.id).status == states.QUEUED
    assert not JobClaim.objects.filter(job_id=job.id).exists()
    with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {world.token}"}) as http:
        # a live client gets it once it is claimable (in 1 s)
        r = wait_for(lambda: (a := http.post(_claim_url(server, world))).status_code != 204
                     and a, 30, "the job to become claimable", interval=0.05)
    assert r.status_code == 200 and r.json()["job"]["id"] == str(job.id)


def _heartbeat_p99(http, url, claim_id, n=200, server=None) -> float:
    """p99 of n heartbeats. A 503 database_unavailable (the shared PostgreSQL out of
    connection slots for a moment: the whole suite's servers share its 100) is sent again at
    once, as the error table says, at most twice, and its time counts."""
    times = []
    for _ in range(n):
        started = time.perf_counter()
        for _attempt in range(3):
            r = http.post(url, json={"claim_id": claim_id})
            if r.status_code != 503 or r.json().get("code") != "database_unavailable":
                break
        times.append(time.perf_counter() - started)
        assert r.status_code == 200, (r.text, server and server.server.output()[-3000:])
    return statistics.quantiles(times, n=100)[98]


def _connection_slots_settle(below: int = 40, timeout: float = 15.0) -> int:
    """PostgreSQL: wait (up to `timeout`) until fewer than `below` client connections are open
    on the shared server, after collecting garbage (a finished thread's Django connection
    closes when it is collected). This test needs a burst of connections; what earlier tests
    left open until collected must not take them. Returns the count seen last."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return 0
    deadline = time.monotonic() + timeout
    while True:
        gc.collect()
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity "
                           "WHERE backend_type = 'client backend'")
            n = cursor.fetchone()[0]
        if n < below or time.monotonic() > deadline:
            return n
        time.sleep(0.2)


def test_heartbeats_are_not_slowed_by_200_held_waits(server):
    print(f"client connections open at the start: {_connection_slots_settle()}")
    world = make_world()
    other = lifecycle.claim_job(world.other_agent,
                                JobFactory(job_agent=world.other_agent).id)
    url = f"{server.url}/v1/workspaces/{world.workspace.id}/jobs/{other.job.id}/heartbeat"
    with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {world.other_token}"}) as http:
        _heartbeat_p99(http, url, str(other.claim_id), n=50)  # warm
        idle = _heartbeat_p99(http, url, str(other.claim_id))
        socks = []
        try:
            for _ in range(200):
                socks.append(_held(server, world, 30))
                time.sleep(0.02)  # their first claims spread out (the server's 100 connections)
            time.sleep(2)  # all held (each worker holds up to 240 - 32)
            busy = _heartbeat_p99(http, url, str(other.claim_id), server=server)
            # the held waits are still held, and answer when jobs come
            jobs = []
            for _ in range(200):  # a producer's pace, not one burst (the database is shared)
                jobs.append(lifecycle.create_job(workspace=world.workspace,
                                                 job_agent=world.agent)[0])
                time.sleep(0.02)
            answers = [_answer(s) for s in socks]
        finally:
            for s in socks:
                s.close()
        # The machine is shared: idle is the worse of the figures before and after the waits.
        idle = max(idle, _heartbeat_p99(http, url, str(other.claim_id), server=server))
    print(f"heartbeat p99 idle {idle * 1000:.1f} ms, with 200 held waits {busy * 1000:.1f} ms")
    # What this guards against is starvation: heartbeats queued behind held waits (sync
    # workers, or threads all taken) wait for seconds. The bound is loose on purpose: the p99 of
    # 200 requests on a 2-core machine running the rest of the suite moves by tens of ms
    # (benchmarks, not this test, measure the latency: docs/performance.md).
    assert busy <= 4 * idle + 0.05, (idle, busy)
    assert all(a.startswith(b"HTTP/1.1 200") for a in answers), {a[:40] for a in answers}
    assert JobClaim.objects.filter(job_id__in=[j.id for j in jobs]).count() == 200


def test_sigterm_ends_held_waits_at_once(server):
    world = make_world()
    sock = _held(server, world, 30)
    _until_held(server, world)
    stopped = time.monotonic()
    server.server.signal(15)
    answer = _answer(sock)
    assert answer.startswith(b"HTTP/1.1 204"), answer[:100]
    assert time.monotonic() - stopped < 3
    sock.close()
