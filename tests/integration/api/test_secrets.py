"""A secret in dispatch_context leaves the service only in the claim response, to the
claimer: never in polls, lists, details, events, other responses, errors, or logs."""

import logging

import pytest

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "s3cr3t-Tok3n-9f8e7d"


def test_secret_appears_only_in_the_claim_response(live_world, caplog):
    caplog.set_level(logging.DEBUG)
    producer, agent = live_world.producer(), live_world.agent_caller()
    agent_id = live_world.agent.id
    context = {"db_password": SECRET, "nested": {"list": [SECRET]}}
    seen = []  # (what, response) for every response except the claim

    def call(what, response):
        seen.append((what, response))
        return response

    body = {"job_agent_id": str(agent_id), "dispatch_context": context}
    created = call("create", producer.post("jobs", json=body, headers={"Idempotency-Key": "k1"}))
    assert created.status_code == 201
    job_id = created.json()["id"]
    call("replay", producer.post("jobs", json=body, headers={"Idempotency-Key": "k1"}))
    reused = call("reuse", producer.post(
        "jobs", json={**body, "priority": 3}, headers={"Idempotency-Key": "k1"}))
    assert reused.status_code == 422
    bad = call("invalid create", producer.post("jobs", json={**body, "priority": "high"}))
    assert bad.status_code == 400
    call("poll", agent.get(f"job-agents/{agent_id}/jobs"))
    call("list", producer.get("jobs"))
    call("list queued", producer.get("jobs?status=queued"))
    call("detail before", producer.get(f"jobs/{job_id}"))

    claim = agent.post(f"job-agents/{agent_id}/jobs/{job_id}/claim")
    assert claim.status_code == 200
    assert claim.json()["job"]["dispatch_context"] == context  # the one place it appears
    claim_id = claim.json()["claim"]["claim_id"]

    call("second claim", agent.post(f"job-agents/{agent_id}/jobs/{job_id}/claim"))
    call("other agent", live_world.agent_caller(live_world.other_token).post(
        f"job-agents/{live_world.other_agent.id}/jobs/{job_id}/claim"))
    call("heartbeat", agent.post(f"jobs/{job_id}/heartbeat", json={"claim_id": claim_id}))
    call("progress", agent.put(f"jobs/{job_id}/status",
                               json={"claim_id": claim_id, "status": "in_progress"}))
    call("detail during", producer.get(f"jobs/{job_id}"))
    call("poll in progress", agent.get(f"job-agents/{agent_id}/jobs?status=in_progress"))
    call("requeue", producer.post(f"jobs/{job_id}/requeue"))
    stale = call("stale heartbeat", agent.post(f"jobs/{job_id}/heartbeat",
                                               json={"claim_id": claim_id}))
    assert stale.status_code == 409
    call("stale report", agent.put(f"jobs/{job_id}/status",
                                   json={"claim_id": claim_id, "status": "successful"}))
    call("cancel", producer.post(f"jobs/{job_id}/cancel"))
    call("detail after", producer.get(f"jobs/{job_id}"))
    call("agent detail", producer.get(f"job-agents/{agent_id}"))

    for what, response in seen:
        assert SECRET not in response.text, what
    detail = producer.get(f"jobs/{job_id}").json()
    assert detail["dispatch_context_keys"] == ["db_password", "nested"]
    assert len(detail["events"]) >= 5
    # The server thread's own records (4xx warnings) are among those captured.
    assert any(r.name == "django.request" for r in caplog.records)
    assert SECRET not in caplog.text
