"""Retryable failures over HTTP: PUT jobs/{id}/status and POST job-agents/{id}/reports with
"retry": true, and a job's retry_backoff_seconds on create."""

import pytest

from jobqueue import lifecycle
from jobqueue.models import Job, JobEvent
from tests.factories import JobFactory
from tests.utils import events_of_kind

from .answers import api_error, parse_ts

pytestmark = pytest.mark.django_db(transaction=True)


def claim(caller, world):
    r = caller.post(f"job-agents/{world.agent.id}/jobs/claim")
    assert r.status_code == 200, r.text
    return r.json()


def test_retryable_failure_queues_with_backoff_then_fails_on_the_last_attempt(live_world):
    producer, agent = live_world.producer(), live_world.agent_caller()
    r = producer.post("jobs", json={"job_agent_id": str(live_world.agent.id), "max_attempts": 2,
                                    "retry_backoff_seconds": 5})
    assert r.status_code == 201 and r.json()["retry_backoff_seconds"] == 5
    job_id = r.json()["id"]
    c = claim(agent, live_world)
    body = {"claim_id": c["claim"]["claim_id"], "status": "failure", "message": "flaky",
            "retry": True}
    out = agent.put(f"jobs/{job_id}/status", json=body)
    assert out.status_code == 200, out.text
    job = out.json()
    assert job["status"] == "queued" and job["completed_at"] is None and job["attempt"] == 1
    assert (parse_ts(job["available_at"]) - parse_ts(job["updated_at"])).total_seconds() == 5
    again = agent.put(f"jobs/{job_id}/status", json=body)
    assert again.status_code == 200 and again.json() == job
    other = agent.put(f"jobs/{job_id}/status", json={**body, "message": "other"})
    api_error(other, 409, "job_finished")
    # The last attempt: failure.
    Job.objects.filter(id=job_id).update(available_at=Job.objects.get(id=job_id).updated_at)
    c2 = claim(agent, live_world)
    assert c2["claim"]["attempt"] == 2
    last = agent.put(f"jobs/{job_id}/status",
                     json={**body, "claim_id": c2["claim"]["claim_id"]})
    assert last.status_code == 200 and last.json()["status"] == "failure"
    assert last.json()["completed_at"] is not None


@pytest.mark.parametrize("value", ["true", 1, None, "yes"])
def test_retry_must_be_a_boolean(world, value):
    agent = world.agent_caller()
    JobFactory(job_agent=world.agent)
    c = claim(agent, world)
    r = agent.put(f"jobs/{c['job']['id']}/status",
                  json={"claim_id": c["claim"]["claim_id"], "status": "failure", "retry": value})
    body = api_error(r, 400, "validation_error", "retry")
    assert "yes" not in r.text
    assert body and Job.objects.get(id=c["job"]["id"]).status == "in_progress"


@pytest.mark.parametrize("status", ["successful", "cancelled", "in_progress"])
def test_retry_with_another_status_is_400(world, status):
    agent = world.agent_caller()
    JobFactory(job_agent=world.agent)
    c = claim(agent, world)
    r = agent.put(f"jobs/{c['job']['id']}/status",
                  json={"claim_id": c["claim"]["claim_id"], "status": status, "retry": True})
    api_error(r, 400, "validation_error", "retry")
    assert Job.objects.get(id=c["job"]["id"]).status == "in_progress"


@pytest.mark.parametrize("value", [-1, 3601, 2**40, 1.5])
def test_retry_backoff_seconds_is_bounded_on_create(world, value):
    r = world.producer().post("jobs", json={"job_agent_id": str(world.agent.id),
                                            "retry_backoff_seconds": value})
    api_error(r, 400, "validation_error", "retry_backoff_seconds")
    assert not Job.objects.exists()


def test_default_backoff_is_shown(world):
    r = world.producer().post("jobs", json={"job_agent_id": str(world.agent.id)})
    assert r.status_code == 201 and r.json()["retry_backoff_seconds"] == 10


def test_batch_report_takes_retry(world):
    agent = world.agent_caller()
    JobFactory.create_batch(2, job_agent=world.agent)
    a, b = lifecycle.claim_next_jobs(world.agent, 2)
    body = {"reports": [
        {"job_id": str(a.job.id), "claim_id": str(a.claim_id), "status": "failure",
         "retry": True},
        {"job_id": str(b.job.id), "claim_id": str(b.claim_id), "status": "successful"},
    ]}
    r = agent.post(f"job-agents/{world.agent.id}/reports", json=body)
    assert r.status_code == 200, r.text
    first, second = r.json()["results"]
    assert first == {"job_id": str(a.job.id), "accepted": True, "status": "queued"}
    assert second["accepted"] and second["status"] == "successful" and second["completed_at"]
    again = agent.post(f"job-agents/{world.agent.id}/reports", json=body)
    assert again.json()["results"] == [first, second]
    bad = agent.post(f"job-agents/{world.agent.id}/reports", json={"reports": [
        {**body["reports"][1], "retry": True}]})
    api_error(bad, 400, "validation_error")
    assert len(events_of_kind(JobEvent.STATUS_REPORTED)) == 2


def test_job_detail_shows_each_attempt(world):
    producer = world.producer()
    JobFactory(job_agent=world.agent, max_attempts=3, initial_max_attempts=3)
    g = lifecycle.claim_next_job(world.agent)
    lifecycle.report_status(g.job.id, g.claim_id, "failure", message="flaky", retry=True)
    Job.objects.filter(id=g.job.id).update(available_at=Job.objects.get(id=g.job.id).updated_at)
    g2 = lifecycle.claim_next_job(world.agent)
    body = producer.get(f"jobs/{g.job.id}").json()
    first, second = body["attempts"]
    assert set(first) == {"number", "claimed_at", "ended_at", "outcome", "message"}
    assert (first["number"], first["outcome"], first["message"]) == (1, "retrying", "flaky")
    assert first["ended_at"] >= first["claimed_at"]
    assert (second["number"], second["outcome"], second["ended_at"]) == (2, None, None)
    lifecycle.report_status(g2.job.id, g2.claim_id, "successful")
    assert producer.get(f"jobs/{g.job.id}").json()["attempts"][1]["outcome"] == "successful"
