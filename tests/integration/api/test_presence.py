"""Presence (#28 item 4; docs/api.md "Presence"): each agent token's `last_used_at`, each
agent's `last_seen_at` and `online`, written by the first request after a minute without one
and then at most once a minute per token, never per request; read by the database's clock.
"""

import threading

import pytest
from django.db import close_old_connections, connection

from agents import credentials, health
from agents.models import AgentToken
from jobqueue.db import NowPlusSeconds
from jobqueue.models import Job, JobAgent
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def _token_of(world):
    return AgentToken.objects.get(job_agent=world.agent)


def _presence_writes():
    """Collects the UPDATEs of agent_token and job_agent the connection runs."""
    writes = []

    def wrapper(execute, sql, params, many, context):
        text = sql.lstrip().upper()
        for table in ("AGENT_TOKEN", "JOB_AGENT"):
            if text.startswith(f'UPDATE "{table}"'):
                writes.append(table.lower())
        return execute(sql, params, many, context)

    return writes, wrapper


def test_the_first_request_records_presence_and_the_api_shows_it(world):
    agent, producer = world.agent_caller(), world.producer()
    before = producer.get(f"job-agents/{world.agent.id}").json()
    assert (before["last_seen_at"], before["online"]) == (None, False)
    assert before["health"]["last_seen_at"] is None
    assert agent.get(f"job-agents/{world.agent.id}/jobs").status_code == 200
    seen = producer.get(f"job-agents/{world.agent.id}").json()
    assert seen["online"] is True and seen["last_seen_at"] is not None
    assert seen["health"]["last_seen_at"] == seen["last_seen_at"]
    listed = {a["id"]: a for a in producer.get("job-agents").json()["results"]}
    assert listed[str(world.agent.id)]["online"] is True
    assert listed[str(world.other_agent.id)]["online"] is False  # never seen
    tokens = producer.get(f"job-agents/{world.agent.id}/tokens").json()["results"]
    assert len(tokens) == 1 and tokens[0]["last_used_at"] is not None
    assert set(tokens[0]) == {"id", "name", "prefix", "created_at", "last_used_at",
                              "expires_at", "revoked_at"}
    assert world.token not in str(tokens) and tokens[0]["prefix"] in world.token
    # The workspace key is no agent: it records nobody's presence.
    producer.get(f"job-agents/{world.other_agent.id}/jobs")
    assert JobAgent.objects.get(id=world.other_agent.id).last_seen_at is None


def test_a_thousand_requests_write_presence_once(world):
    """The count the contract asks for: 1,000 agent requests within the minute cost one write
    of the token and one of the agent, and no write of any job."""
    agent = world.agent_caller()
    job = JobFactory(job_agent=world.agent)
    claim_id = agent.post(f"job-agents/{world.agent.id}/jobs/{job.id}/claim").json()[
        "claim"]["claim_id"]
    updated_at = Job.objects.get(id=job.id).updated_at
    AgentToken.objects.update(last_used_at=None)  # as if never used: the next one writes
    writes, wrapper = _presence_writes()
    with connection.execute_wrapper(wrapper):
        for i in range(1000):
            if i % 2:
                r = agent.post(f"jobs/{job.id}/heartbeat", json={"claim_id": claim_id})
            else:
                r = agent.get(f"job-agents/{world.agent.id}/jobs")
            assert r.status_code == 200
    assert sorted(writes) == ["agent_token", "job_agent"]
    assert Job.objects.get(id=job.id).updated_at == updated_at  # heartbeats never write job


def test_a_minute_later_the_next_request_writes_again(world, settings):
    agent = world.agent_caller()
    assert agent.get(f"job-agents/{world.agent.id}/jobs").status_code == 200
    # Used 30 s ago (the database's clock): within the minute, nothing is written.
    AgentToken.objects.update(last_used_at=NowPlusSeconds(-30))
    JobAgent.objects.filter(id=world.agent.id).update(last_seen_at=NowPlusSeconds(-30))
    used = _token_of(world).last_used_at
    agent.get(f"job-agents/{world.agent.id}/jobs")
    assert _token_of(world).last_used_at == used
    # 61 s ago: the next request writes both.
    AgentToken.objects.update(last_used_at=NowPlusSeconds(-61))
    JobAgent.objects.filter(id=world.agent.id).update(last_seen_at=NowPlusSeconds(-61))
    used = _token_of(world).last_used_at
    agent.get(f"job-agents/{world.agent.id}/jobs")
    assert _token_of(world).last_used_at > used
    assert JobAgent.objects.get(id=world.agent.id).last_seen_at > used


def test_each_token_of_an_agent_records_its_own_use(world):
    second, raw = credentials.create_agent_token(world.agent, name="second")
    AgentToken.objects.filter(id=second.id).update(created_at=NowPlusSeconds(1))  # the newer
    world.agent_caller().get(f"job-agents/{world.agent.id}/jobs")
    assert AgentToken.objects.get(id=second.id).last_used_at is None
    JobAgent.objects.filter(id=world.agent.id).update(last_seen_at=NowPlusSeconds(-600))
    world.agent_caller(raw).get(f"job-agents/{world.agent.id}/jobs")
    assert AgentToken.objects.get(id=second.id).last_used_at is not None
    producer = world.producer()
    assert producer.get(f"job-agents/{world.agent.id}").json()["online"] is True
    names = [t["name"] for t in producer.get(f"job-agents/{world.agent.id}/tokens")
             .json()["results"]]
    assert names == ["second", "default"]  # newest first


def test_online_follows_the_setting_on_the_database_clock(world, settings):
    producer = world.producer()
    JobAgent.objects.filter(id=world.agent.id).update(last_seen_at=NowPlusSeconds(-119))
    assert producer.get(f"job-agents/{world.agent.id}").json()["online"] is True
    JobAgent.objects.filter(id=world.agent.id).update(last_seen_at=NowPlusSeconds(-121))
    assert producer.get(f"job-agents/{world.agent.id}").json()["online"] is False
    settings.JOBQUEUE = {**settings.JOBQUEUE, "AGENT_ONLINE_SECONDS": 600}
    assert producer.get(f"job-agents/{world.agent.id}").json()["online"] is True


def test_a_revoked_token_stays_listed_with_its_revocation(world):
    producer = world.producer()
    issued = producer.post(f"job-agents/{world.agent.id}/tokens", json={"name": "ci"}).json()
    producer.delete(f"job-agents/{world.agent.id}/tokens/{issued['id']}")
    listed = {t["id"]: t for t in producer.get(f"job-agents/{world.agent.id}/tokens")
              .json()["results"]}
    assert listed[issued["id"]]["revoked_at"] is not None
    assert issued["token"] not in str(listed)
    assert producer.get(f"job-agents/{world.other_workspace_agent.id}/tokens").status_code == 404


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_racing_first_requests_write_once(world):
    """Eight requests of one token that all read it as due: the conditional UPDATE lets one
    write; the others find it written (PostgreSQL: each waits for the row, then re-checks)."""
    token = _token_of(world)
    barrier = threading.Barrier(8)
    results = []

    def request():
        try:
            barrier.wait()
            results.append(health.note_token_used(token.id, world.agent.id))
        finally:
            close_old_connections()
            connection.close()

    threads = [threading.Thread(target=request) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * 7 + [True]
