"""Idempotent creation fingerprints what the producer sent, not the defaults filled in
(#17 item 5): a byte-identical replay after an operator changes a default gets the original
job back, never 422."""

import pytest

from jobqueue import lifecycle
from jobqueue.lifecycle import create
from jobqueue.models import Job, JobAgent
from tests.utils import run_threads

KEY = {"Idempotency-Key": "order-17"}


def _body(world, **extra):
    return {"job_agent_id": str(world.agent.id), "dispatch_context": {"n": 1}, **extra}


def test_a_replay_after_the_agents_max_attempts_changed_returns_the_original_job(world):
    producer = world.producer()
    first = producer.post("jobs", json=_body(world), headers=KEY)
    assert first.status_code == 201
    original = first.json()
    # An operator changes the agent's default.
    JobAgent.objects.filter(id=world.agent.id).update(max_attempts=original["max_attempts"] + 4)
    replay = producer.post("jobs", json=_body(world), headers=KEY)
    assert replay.status_code == 200, replay.content
    assert replay.json()["id"] == original["id"]
    # The original job, with the attempts it was created with.
    assert replay.json()["max_attempts"] == original["max_attempts"]
    assert Job.objects.count() == 1


def test_a_replay_after_the_service_default_changed_returns_the_original_job(world, settings):
    JobAgent.objects.filter(id=world.agent.id).update(max_attempts=None)
    producer = world.producer()
    first = producer.post("jobs", json=_body(world), headers=KEY)
    assert first.status_code == 201
    settings.JOBQUEUE = {**getattr(settings, "JOBQUEUE", {}), "DEFAULT_MAX_ATTEMPTS": 9}
    replay = producer.post("jobs", json=_body(world), headers=KEY)
    assert replay.status_code == 200, replay.content
    assert replay.json()["id"] == first.json()["id"]
    assert replay.json()["max_attempts"] == first.json()["max_attempts"] != 9


def test_sending_the_default_explicitly_is_another_request(world):
    """Omitting max_attempts and sending the value it defaulted to are different requests:
    the first would follow a changed default, the second would not."""
    producer = world.producer()
    first = producer.post("jobs", json=_body(world), headers=KEY)
    assert first.status_code == 201
    explicit = producer.post(
        "jobs", json=_body(world, max_attempts=first.json()["max_attempts"]), headers=KEY
    )
    assert explicit.status_code == 422 and explicit.json()["code"] == "idempotency_key_reused"
    # And the other way round.
    key = {"Idempotency-Key": "explicit"}
    assert producer.post("jobs", json=_body(world, max_attempts=2), headers=key).status_code == 201
    assert producer.post("jobs", json=_body(world, max_attempts=2), headers=key).status_code == 200
    omitted = producer.post("jobs", json=_body(world), headers=key)
    assert omitted.status_code == 422 and omitted.json()["code"] == "idempotency_key_reused"
    assert Job.objects.count() == 2


def test_another_body_is_still_refused_after_a_config_change(world):
    producer = world.producer()
    assert producer.post("jobs", json=_body(world), headers=KEY).status_code == 201
    JobAgent.objects.filter(id=world.agent.id).update(max_attempts=7)
    other = producer.post("jobs", json=_body(world, priority=5), headers=KEY)
    assert other.status_code == 422 and other.json()["code"] == "idempotency_key_reused"
    assert Job.objects.get().priority == 0


def test_a_job_fingerprinted_before_the_change_still_replays(world):
    """Jobs created before fingerprints were versioned hold a fingerprint of the default
    max_attempts filled in; their byte-identical replays still return them."""
    producer = world.producer()
    first = producer.post("jobs", json=_body(world), headers=KEY)
    job = Job.objects.get(id=first.json()["id"])
    legacy = create._fingerprint({
        "job_agent": str(world.agent.id), "job_agent_config": {}, "dispatch_context": {"n": 1},
        "priority": 0, "max_attempts": job.initial_max_attempts, "delay_seconds": None,
        "external_id": "", "hold": False,
    })
    Job.objects.filter(id=job.id).update(idempotency_fingerprint=legacy)
    JobAgent.objects.filter(id=world.agent.id).update(max_attempts=job.initial_max_attempts + 1)
    replay = producer.post("jobs", json=_body(world), headers=KEY)
    assert replay.status_code == 200 and replay.json()["id"] == str(job.id)
    # An explicit max_attempts never matches the legacy form by that route.
    explicit = producer.post("jobs", json=_body(world, max_attempts=1), headers=KEY)
    assert explicit.status_code == 422
    different = producer.post("jobs", json=_body(world, dispatch_context={"n": 2}), headers=KEY)
    assert different.status_code == 422


@pytest.mark.django_db(transaction=True)
def test_replays_racing_a_config_change_all_get_the_one_job():
    from tests.factories import JobAgentFactory

    agent = JobAgentFactory(max_attempts=3)

    def create_or_change(i, barrier):
        barrier.wait()
        if i == 0:
            JobAgent.objects.filter(id=agent.id).update(max_attempts=8)
            return None
        job, created = lifecycle.create_job(
            workspace=agent.workspace, job_agent=JobAgent.objects.get(id=agent.id),
            dispatch_context={"x": 1}, idempotency_key="same-key",
        )
        return job.id, created

    results = [r for r in run_threads(create_or_change, 7) if r is not None]
    assert len(results) == 6
    assert len({job_id for job_id, _ in results}) == 1
    assert sum(created for _, created in results) == 1
    assert Job.objects.count() == 1
