"""The whole flow over a real HTTP connection (live server), on both backends."""

import datetime as dt

import pytest

from jobqueue.models import Job, JobClaim, JobEvent

from .answers import parse_ts

pytestmark = pytest.mark.django_db(transaction=True)


def create_job(producer, world, **body):
    r = producer.post("jobs", json={"job_agent_id": str(world.agent.id), **body})
    assert r.status_code == 201, r.text
    return r.json()


def test_create_poll_claim_heartbeat_report(live_world):
    producer, agent = live_world.producer(), live_world.agent_caller()
    job = create_job(producer, live_world, job_agent_config={"cmd": "echo"},
                     dispatch_context={"env": "prod"}, priority=5, external_id="ext-1")
    assert job["status"] == "queued" and job["attempt"] == 0
    assert "dispatch_context" not in job

    poll = agent.get(f"job-agents/{live_world.agent.id}/jobs?status=queued")
    assert poll.status_code == 200
    page = poll.json()
    assert [item["id"] for item in page["results"]] == [job["id"]]
    assert set(page["results"][0]) == {"id", "status", "attempt", "max_attempts", "priority",
                                       "available_at", "created_at", "external_id"}
    assert page["next"] is None

    claim = agent.post(f"job-agents/{live_world.agent.id}/jobs/{job['id']}/claim")
    assert claim.status_code == 200, claim.text
    body = claim.json()
    assert body["job"]["id"] == job["id"] and body["job"]["status"] == "in_progress"
    assert body["job"]["dispatch_context"] == {"env": "prod"}
    info = body["claim"]
    assert info["attempt"] == 1 and info["lease_seconds"] == 30
    assert info["heartbeat_interval_seconds"] == 10
    assert parse_ts(info["claim_expires_at"]) == \
        parse_ts(info["server_time"]) + dt.timedelta(seconds=30)

    # Claimed: no longer in the queued poll, and a second claim is refused.
    assert agent.get(f"job-agents/{live_world.agent.id}/jobs").json()["results"] == []
    again = agent.post(f"job-agents/{live_world.agent.id}/jobs/{job['id']}/claim")
    assert again.status_code == 409 and again.json()["code"] == "job_not_claimable"

    hb = agent.post(f"jobs/{job['id']}/heartbeat", json={"claim_id": info["claim_id"]})
    assert hb.status_code == 200, hb.text
    assert hb.json()["job_id"] == job["id"]
    assert parse_ts(hb.json()["claim_expires_at"]) >= parse_ts(info["claim_expires_at"])

    progress = agent.put(f"jobs/{job['id']}/status",
                         json={"claim_id": info["claim_id"], "status": "in_progress",
                               "message": "half way"})
    assert progress.status_code == 200 and progress.json()["message"] == "half way"

    done = agent.put(f"jobs/{job['id']}/status",
                     json={"claim_id": info["claim_id"], "status": "successful",
                           "result": {"ok": True}, "external_id": "run-9"})
    assert done.status_code == 200, done.text
    assert done.json()["status"] == "successful" and done.json()["result"] == {"ok": True}
    assert done.json()["completed_at"] and "dispatch_context" not in done.json()

    detail = producer.get(f"jobs/{job['id']}").json()
    assert detail["status"] == "successful" and detail["claim"] is None
    assert detail["dispatch_context_keys"] == ["env"]
    assert [e["kind"] for e in detail["events"]] == [
        "created", "claimed", "progress_reported", "status_reported"
    ]
    assert not JobClaim.objects.filter(job_id=job["id"]).exists()


def test_claim_next_then_nothing_left_is_204(live_world):
    producer, agent = live_world.producer(), live_world.agent_caller()
    low = create_job(producer, live_world, priority=0)
    high = create_job(producer, live_world, priority=9)
    first = agent.post(f"job-agents/{live_world.agent.id}/jobs/claim")
    second = agent.post(f"job-agents/{live_world.agent.id}/jobs/claim", json={})
    assert first.status_code == second.status_code == 200
    assert [first.json()["job"]["id"], second.json()["job"]["id"]] == [high["id"], low["id"]]
    empty = agent.post(f"job-agents/{live_world.agent.id}/jobs/claim")
    assert empty.status_code == 204 and empty.content == b""


def test_batch_claim(live_world):
    producer, agent = live_world.producer(), live_world.agent_caller()
    ids = {create_job(producer, live_world)["id"] for _ in range(3)}
    r = agent.post(f"job-agents/{live_world.agent.id}/jobs/claim", json={"limit": 2})
    assert r.status_code == 200
    claims = r.json()["claims"]
    assert len(claims) == 2 and {c["job"]["id"] for c in claims} < ids
    assert len({c["claim"]["claim_id"] for c in claims}) == 2
    rest = agent.post(f"job-agents/{live_world.agent.id}/jobs/claim", json={"limit": 5})
    assert len(rest.json()["claims"]) == 1
    none = agent.post(f"job-agents/{live_world.agent.id}/jobs/claim", json={"limit": 5})
    assert none.status_code == 200 and none.json() == {"claims": []}


def test_release_returns_job_to_queue(live_world):
    producer, agent = live_world.producer(), live_world.agent_caller()
    job = create_job(producer, live_world)
    claim = agent.post(f"job-agents/{live_world.agent.id}/jobs/{job['id']}/claim").json()["claim"]
    r = agent.post(f"jobs/{job['id']}/release",
                   json={"claim_id": claim["claim_id"], "reason": "shutting down"})
    assert r.status_code == 200 and r.json()["status"] == "queued"
    # The old claim is dead; the job can be claimed again (attempt 2).
    stale = agent.post(f"jobs/{job['id']}/heartbeat", json={"claim_id": claim["claim_id"]})
    assert stale.status_code == 409 and stale.json()["code"] == "claim_superseded"
    again = agent.post(f"job-agents/{live_world.agent.id}/jobs/{job['id']}/claim")
    assert again.status_code == 200 and again.json()["claim"]["attempt"] == 2


def test_release_with_retry_after_hides_job_from_poll(live_world):
    producer, agent = live_world.producer(), live_world.agent_caller()
    job = create_job(producer, live_world)
    claim = agent.post(f"job-agents/{live_world.agent.id}/jobs/{job['id']}/claim").json()["claim"]
    r = agent.post(f"jobs/{job['id']}/release",
                   json={"claim_id": claim["claim_id"], "retry_after_seconds": 3600})
    assert r.status_code == 200
    assert agent.get(f"job-agents/{live_world.agent.id}/jobs").json()["results"] == []
    assert agent.post(f"job-agents/{live_world.agent.id}/jobs/claim").status_code == 204


@pytest.mark.parametrize("operation, code", [("cancel", "job_cancelled"),
                                             ("requeue", "claim_superseded")])
def test_operator_supersedes_a_heartbeating_holder(live_world, operation, code):
    producer, agent = live_world.producer(), live_world.agent_caller()
    job = create_job(producer, live_world)
    claim = agent.post(f"job-agents/{live_world.agent.id}/jobs/{job['id']}/claim").json()["claim"]
    beat = {"claim_id": claim["claim_id"]}
    assert agent.post(f"jobs/{job['id']}/heartbeat", json=beat).status_code == 200

    r = producer.post(f"jobs/{job['id']}/{operation}", json={"reason": "operator says so"})
    assert r.status_code == 200, r.text
    assert r.json()["status"] == ("cancelled" if operation == "cancel" else "queued")

    hb = agent.post(f"jobs/{job['id']}/heartbeat", json=beat)
    assert hb.status_code == 409 and hb.json()["code"] == code
    report = agent.put(f"jobs/{job['id']}/status", json={**beat, "status": "successful"})
    assert report.status_code == 409 and report.json()["code"] == code
    assert Job.objects.get(id=job["id"]).status == r.json()["status"]
    refused = JobEvent.objects.filter(job_id=job["id"], kind=JobEvent.STALE_WRITE_REFUSED)
    assert refused.count() == 2


def test_retried_terminal_report_is_200_and_stale_one_409(live_world):
    producer, agent = live_world.producer(), live_world.agent_caller()
    job = create_job(producer, live_world)
    url = f"job-agents/{live_world.agent.id}/jobs/{job['id']}/claim"
    first = agent.post(url).json()["claim"]["claim_id"]
    # The first holder releases; a second claim gets a new claim_id.
    agent.post(f"jobs/{job['id']}/release", json={"claim_id": first})
    second = agent.post(url).json()["claim"]["claim_id"]
    report = {"claim_id": second, "status": "failure", "message": "boom"}
    done = agent.put(f"jobs/{job['id']}/status", json=report)
    assert done.status_code == 200
    retry = agent.put(f"jobs/{job['id']}/status", json=report)
    assert retry.status_code == 200 and retry.json() == done.json()
    # The same claim and status with other content is not a retry: its content was not taken.
    for change in ({"message": "other"}, {"result": {"exit": 1}}):
        different = agent.put(f"jobs/{job['id']}/status", json={**report, **change})
        assert different.status_code == 409 and different.json()["code"] == "job_finished"
        assert "other" not in different.text
    assert producer.get(f"jobs/{job['id']}").json()["message"] == "boom"
    stale = agent.put(f"jobs/{job['id']}/status", json={**report, "claim_id": first})
    assert stale.status_code == 409 and stale.json()["code"] == "job_finished"
    other_status = agent.put(f"jobs/{job['id']}/status", json={**report, "status": "successful"})
    assert other_status.status_code == 409 and other_status.json()["code"] == "job_finished"


def test_hold_then_dispatch(live_world):
    producer, agent = live_world.producer(), live_world.agent_caller()
    job = create_job(producer, live_world, hold=True)
    assert job["status"] == "pending"
    assert agent.post(f"job-agents/{live_world.agent.id}/jobs/claim").status_code == 204
    r = producer.post(f"jobs/{job['id']}/dispatch")
    assert r.status_code == 200 and r.json()["status"] == "queued"
    again = producer.post(f"jobs/{job['id']}/dispatch")
    assert again.status_code == 409 and again.json()["code"] == "invalid_transition"
    assert agent.post(f"job-agents/{live_world.agent.id}/jobs/claim").status_code == 200


@pytest.mark.parametrize("operation, code", [("cancel", "job_cancelled"),
                                             ("requeue", "claim_superseded")])
def test_a_holder_heartbeating_in_the_background_is_stopped_by_409(live_world, operation, code):
    """A real holder keeps beating on its own connection while the operator acts."""
    import threading

    producer = live_world.producer()
    job = create_job(producer, live_world)
    holder = live_world.agent_caller()
    claim = holder.post(f"job-agents/{live_world.agent.id}/jobs/{job['id']}/claim").json()
    beat = {"claim_id": claim["claim"]["claim_id"]}
    beats_ok, stopped_by = [], []
    first_beat = threading.Event()

    def heartbeat_loop():
        while True:
            r = holder.post(f"jobs/{job['id']}/heartbeat", json=beat)
            if r.status_code != 200:
                stopped_by.append((r.status_code, r.json()["code"]))
                return
            beats_ok.append(r.json()["claim_expires_at"])
            first_beat.set()

    thread = threading.Thread(target=heartbeat_loop)
    thread.start()
    assert first_beat.wait(30)
    r = producer.post(f"jobs/{job['id']}/{operation}")
    assert r.status_code == 200
    thread.join(30)
    assert not thread.is_alive()
    assert stopped_by == [(409, code)]
    assert beats_ok  # it was really beating before
    assert not JobClaim.objects.filter(job_id=job["id"]).exists()
    assert Job.objects.get(id=job["id"]).status == r.json()["status"]
