"""The clocks over HTTP: max_runtime_seconds and expires_at on POST jobs (and the agent's
default on POST job-agents), shown on the job; 409 deadline_exceeded for the holder."""

import datetime as dt

import pytest
from django.db.models import F

from jobqueue import lifecycle
from jobqueue.db import db_now
from jobqueue.models import Job, JobClaim
from tests.factories import JobFactory

from .answers import api_error, parse_ts

pytestmark = pytest.mark.django_db(transaction=True)


def test_create_with_clocks_and_claim_caps_the_lease(world):
    producer, agent = world.producer(), world.agent_caller()
    expires = (db_now() + dt.timedelta(minutes=10)).isoformat().replace("+00:00", "Z")
    r = producer.post("jobs", json={"job_agent_id": str(world.agent.id),
                                    "max_runtime_seconds": 7, "expires_at": expires})
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["max_runtime_seconds"] == 7 and parse_ts(job["expires_at"]) == parse_ts(expires)
    claim = agent.post(f"job-agents/{world.agent.id}/jobs/claim").json()["claim"]
    remaining = parse_ts(claim["claim_expires_at"]) - parse_ts(claim["server_time"])
    assert remaining == dt.timedelta(seconds=7)  # the lease (30 s) capped at the runtime
    assert producer.get(f"jobs/{job['id']}").json()["max_runtime_seconds"] == 7
    plain = producer.post("jobs", json={"job_agent_id": str(world.agent.id)}).json()
    assert plain["max_runtime_seconds"] is None and plain["expires_at"] is None


@pytest.mark.parametrize(("field", "value"), [
    ("max_runtime_seconds", 0), ("max_runtime_seconds", 10**9),
    ("max_runtime_seconds", "soon"), ("expires_at", "2001-01-01T00:00:00Z"),
    ("expires_at", "tomorrow"), ("expires_at", 12),
])
def test_clock_fields_bad_input_is_400_without_echo(world, field, value):
    r = world.producer().post("jobs", json={"job_agent_id": str(world.agent.id),
                                            field: value})
    api_error(r, 400, "validation_error", field)
    assert "soon" not in r.text and "tomorrow" not in r.text
    assert not Job.objects.exists()


def test_job_agent_default_runtime(world):
    r = world.producer().post("job-agents", json={"name": "timed", "max_runtime_seconds": 60})
    assert r.status_code == 201 and r.json()["max_runtime_seconds"] == 60
    job = world.producer().post("jobs", json={"job_agent_id": r.json()["id"]}).json()
    assert job["max_runtime_seconds"] == 60
    bad = world.producer().post("job-agents", json={"name": "x", "max_runtime_seconds": 0})
    api_error(bad, 400, "validation_error", "max_runtime_seconds")


def test_the_holder_gets_deadline_exceeded(world):
    agent = world.agent_caller()
    JobFactory(job_agent=world.agent, max_runtime_seconds=5)
    JobFactory(job_agent=world.agent, max_runtime_seconds=5)
    a, b = lifecycle.claim_next_jobs(world.agent, 2)
    past = dt.timedelta(seconds=6)
    for g in (a, b):
        Job.objects.filter(id=g.job.id).update(started_at=F("started_at") - past)
        JobClaim.objects.filter(job_id=g.job.id).update(
            deadline_at=F("deadline_at") - past, claim_expires_at=F("claim_expires_at") - past)
    r = agent.post(f"jobs/{a.job.id}/heartbeat", json={"claim_id": str(a.claim_id)})
    api_error(r, 409, "deadline_exceeded")
    r = agent.put(f"jobs/{a.job.id}/status",
                  json={"claim_id": str(a.claim_id), "status": "successful"})
    api_error(r, 409, "deadline_exceeded")
    r = agent.post(f"job-agents/{world.agent.id}/heartbeat",
                   json={"claims": [{"job_id": str(b.job.id), "claim_id": str(b.claim_id)}]})
    assert r.json()["results"][0]["code"] == "deadline_exceeded"
    r = agent.post(f"job-agents/{world.agent.id}/reports", json={"reports": [
        {"job_id": str(b.job.id), "claim_id": str(b.claim_id), "status": "successful"}]})
    assert r.json()["results"][0] == {"job_id": str(b.job.id), "accepted": False,
                                      "code": "deadline_exceeded"}
    assert Job.objects.filter(status="in_progress").count() == 2
