"""Producer views of jobs: filters, the detail's claim state, delayed and held jobs."""

import pytest

from jobqueue import lifecycle
from jobqueue.db import NowPlusSeconds
from jobqueue.models import JobClaim
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def test_detail_shows_the_lease_but_never_the_claim_id(world):
    job = JobFactory(job_agent=world.agent, dispatch_context={"b": 1, "a": {"secret": "x"}})
    grant = lifecycle.claim_job(world.agent, job.id)
    producer = world.producer()
    detail = producer.get(f"jobs/{job.id}").json()
    claim = detail["claim"]
    assert set(claim) == {"attempt", "claimed_at", "claim_expires_at", "lease_seconds",
                          "heartbeat_at", "lease_state"}
    assert (claim["attempt"], claim["lease_seconds"], claim["lease_state"]) == (1, 30, "active")
    assert claim["heartbeat_at"] is None
    assert detail["dispatch_context_keys"] == ["a", "b"]
    assert "dispatch_context" not in detail
    assert str(grant.claim_id) not in producer.get(f"jobs/{job.id}").content.decode()

    lifecycle.heartbeat(job.id, grant.claim_id)
    assert producer.get(f"jobs/{job.id}").json()["claim"]["heartbeat_at"] is not None
    JobClaim.objects.filter(job_id=job.id).update(claim_expires_at=NowPlusSeconds(-1))
    assert producer.get(f"jobs/{job.id}").json()["claim"]["lease_state"] == "expired"


def test_list_filters(world):
    queued = JobFactory(job_agent=world.agent)
    other = JobFactory(job_agent=world.other_agent)
    running = JobFactory(job_agent=world.agent)
    lifecycle.claim_job(world.agent, running.id)
    JobFactory(job_agent=world.other_workspace_agent)
    producer = world.producer()

    def ids(query):
        r = producer.get("jobs" + query)
        assert r.status_code == 200
        return {item["id"] for item in r.json()["results"]}

    assert ids("") == {str(queued.id), str(other.id), str(running.id)}
    assert ids("?status=queued") == {str(queued.id), str(other.id)}
    assert ids(f"?job_agent_id={world.agent.id}") == {str(queued.id), str(running.id)}
    assert ids(f"?status=in_progress&job_agent_id={world.agent.id}") == {str(running.id)}
    listed = producer.get("jobs").json()["results"][0]
    # A summary: nothing a job may hold in bulk (GET jobs/{job_id} has those).
    assert not {"dispatch_context", "job_agent_config", "result", "message"} & set(listed)
    assert {"id", "status", "attempt", "max_attempts", "external_id"} <= set(listed)
    agent = world.agent_caller()
    poll = agent.get(f"job-agents/{world.agent.id}/jobs?status=in_progress").json()
    assert [item["id"] for item in poll["results"]] == [str(running.id)]


def test_delayed_and_held_jobs_are_not_claimable_yet(world):
    producer, agent = world.producer(), world.agent_caller()
    body = {"job_agent_id": str(world.agent.id)}
    delayed = producer.post("jobs", json={**body, "delay_seconds": 3600}).json()
    held = producer.post("jobs", json={**body, "hold": True}).json()
    assert delayed["status"] == "queued" and held["status"] == "pending"
    assert delayed["available_at"] > delayed["created_at"]
    assert agent.get(f"job-agents/{world.agent.id}/jobs").json()["results"] == []
    assert agent.post(f"job-agents/{world.agent.id}/jobs/claim").status_code == 204
    r = agent.post(f"job-agents/{world.agent.id}/jobs/{delayed['id']}/claim")
    assert r.status_code == 409 and r.json()["code"] == "job_not_claimable"
    assert producer.post(f"jobs/{held['id']}/dispatch").status_code == 200
    claimed = agent.post(f"job-agents/{world.agent.id}/jobs/claim")
    assert claimed.status_code == 200 and claimed.json()["job"]["id"] == held["id"]


def test_requeue_grants_fresh_attempts(world):
    job = JobFactory(job_agent=world.agent, max_attempts=2, initial_max_attempts=2)
    grant = lifecycle.claim_job(world.agent, job.id)
    lifecycle.report_status(job.id, grant.claim_id, "failure")
    producer = world.producer()
    r = producer.post(f"jobs/{job.id}/requeue", json={"reason": "retry after fix"})
    assert r.status_code == 200
    assert (r.json()["status"], r.json()["attempt"], r.json()["max_attempts"]) == ("queued", 1, 3)
    pending = producer.post("jobs", json={"job_agent_id": str(world.agent.id), "hold": True})
    r = producer.post(f"jobs/{pending.json()['id']}/requeue")
    assert r.status_code == 409 and r.json()["code"] == "invalid_transition"
