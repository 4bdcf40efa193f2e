"""Idempotency-Key on claim-next (single and batch): a retry with the same key by the same
agent gets the same claim(s) back while current; keys are per agent; they end with the claim."""

import pytest

from jobqueue import lifecycle, states
from jobqueue.models import JobClaim, JobEvent
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def _claim_next(world, key, body=None, token=None):
    caller = world.agent_caller(token)
    headers = {"Authorization": f"Bearer {token or world.token}"}
    if key is not None:
        headers["Idempotency-Key"] = key
    return caller.with_headers(headers).post(f"job-agents/{world.agent.id}/jobs/claim",
                                             json=body)


def test_a_retry_with_the_same_key_gets_the_same_claim(world):
    for _ in range(3):
        JobFactory(job_agent=world.agent, dispatch_context={"secret": "s"})
    first = _claim_next(world, "k-1")
    assert first.status_code == 200
    events = JobEvent.objects.count()
    again = _claim_next(world, "k-1")
    assert again.status_code == 200
    assert again.json()["job"]["id"] == first.json()["job"]["id"]
    assert again.json()["claim"]["claim_id"] == first.json()["claim"]["claim_id"]
    assert again.json()["job"]["dispatch_context"] == {"secret": "s"}
    assert JobClaim.objects.count() == 1 and JobEvent.objects.count() == events
    other = _claim_next(world, "k-2")
    assert other.json()["job"]["id"] != first.json()["job"]["id"]
    plain = _claim_next(world, None)
    assert plain.json()["job"]["id"] not in (first.json()["job"]["id"], other.json()["job"]["id"])


def test_a_batch_retry_gets_the_same_batch(world):
    for _ in range(5):
        JobFactory(job_agent=world.agent)
    first = _claim_next(world, "batch-1", {"limit": 3})
    ids = [c["claim"]["claim_id"] for c in first.json()["claims"]]
    assert len(ids) == 3
    again = _claim_next(world, "batch-1", {"limit": 3})
    assert [c["claim"]["claim_id"] for c in again.json()["claims"]] == ids
    assert JobClaim.objects.count() == 3


def test_keys_are_per_agent(world):
    JobFactory(job_agent=world.agent)
    JobFactory(job_agent=world.other_agent)
    mine = _claim_next(world, "shared")
    theirs = world.agent_caller(world.other_token).with_headers({
        "Authorization": f"Bearer {world.other_token}", "Idempotency-Key": "shared",
    }).post(f"job-agents/{world.other_agent.id}/jobs/claim")
    assert theirs.status_code == 200
    assert theirs.json()["job"]["id"] != mine.json()["job"]["id"]
    assert theirs.json()["job"]["job_agent_id"] == str(world.other_agent.id)


@pytest.mark.parametrize("ending", ["report", "release", "requeue"])
def test_the_key_ends_with_its_claim(world, ending):
    JobFactory(job_agent=world.agent)
    JobFactory(job_agent=world.agent)
    first = _claim_next(world, "k").json()
    job_id, claim_id = first["job"]["id"], first["claim"]["claim_id"]
    if ending == "report":
        lifecycle.report_status(job_id, claim_id, states.SUCCESSFUL)
    elif ending == "release":
        lifecycle.release_job(job_id, claim_id)
    else:
        lifecycle.requeue_job(job_id)
    again = _claim_next(world, "k")
    assert again.status_code == 200
    assert again.json()["claim"]["claim_id"] != claim_id
    assert JobClaim.objects.filter(idempotency_key="k").count() == 1


def test_none_claimable_with_a_key_is_204_and_stores_nothing(world):
    assert _claim_next(world, "k").status_code == 204
    assert not JobClaim.objects.exists()


@pytest.mark.parametrize("key", ["x" * 256, "tab\there"])
def test_a_bad_key_is_a_400_that_claims_nothing(world, key):
    JobFactory(job_agent=world.agent)
    r = _claim_next(world, key)
    assert r.status_code == 400 and r.json()["code"] == "validation_error"
    assert key not in r.content.decode()
    assert not JobClaim.objects.exists()


def test_the_key_is_never_shown(world):
    job = JobFactory(job_agent=world.agent)
    r = _claim_next(world, "secret-key-123")
    assert "secret-key-123" not in r.content.decode()
    detail = world.producer().get(f"jobs/{job.id}")
    assert "secret-key-123" not in detail.content.decode()
