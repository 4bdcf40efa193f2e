"""Checkpoints: saved by a heartbeat or a progress report with the current claim, handed to
the claim of the next attempt across release, reap, requeue, the end of max_runtime_seconds
and a retryable failure; a stale holder's checkpoint is
refused; heartbeats still never write the job table."""

import pytest
from django.db import connection
from django.test import override_settings

from jobqueue import lifecycle, states
from jobqueue.db import NowPlusSeconds
from jobqueue.models import Job, JobCheckpoint, JobClaim
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def _claim(world, job):
    r = world.agent_caller().post(f"job-agents/{world.agent.id}/jobs/{job.id}/claim")
    assert r.status_code == 200
    return r.json()["claim"]


def _beat(world, job, claim_id, checkpoint):
    return world.agent_caller().post(f"jobs/{job.id}/heartbeat",
                                     json={"claim_id": claim_id, "checkpoint": checkpoint})


def _progress(world, job, claim_id, checkpoint, status="in_progress"):
    return world.agent_caller().put(f"jobs/{job.id}/status", json={
        "claim_id": claim_id, "status": status, "checkpoint": checkpoint})


def _job_row(job):
    if connection.vendor == "postgresql":
        with connection.cursor() as cur:
            cur.execute("SELECT xmin::text, ctid::text, updated_at FROM job WHERE id = %s",
                        [job.id])
            return cur.fetchone()
    return Job.objects.filter(id=job.id).values_list("updated_at", "status", "message").get()


def test_the_first_claim_has_no_checkpoint(world):
    assert _claim(world, JobFactory(job_agent=world.agent))["checkpoint"] is None


@pytest.mark.parametrize("ending", ["release", "reap", "requeue", "runtime", "retry"])
def test_a_heartbeat_checkpoint_is_handed_to_the_next_attempt(world, ending):
    job = JobFactory(job_agent=world.agent, max_runtime_seconds=600, retry_backoff_seconds=1)
    claim = _claim(world, job)
    row = _job_row(job)
    r = _beat(world, job, claim["claim_id"], {"step": 3, "done": ["a", "b"]})
    assert r.status_code == 200
    r = _beat(world, job, claim["claim_id"], {"step": 4})
    assert r.status_code == 200
    assert _job_row(job) == row  # a heartbeat never writes the job table
    if ending == "release":
        lifecycle.release_job(job.id, claim["claim_id"])
    elif ending == "reap":
        JobClaim.objects.filter(job_id=job.id).update(claim_expires_at=NowPlusSeconds(-5))
        lifecycle.reap_expired_claims_once(100)
    elif ending == "runtime":  # max_runtime_seconds ended the attempt (docs/clocks.md)
        JobClaim.objects.filter(job_id=job.id).update(deadline_at=NowPlusSeconds(-1),
                                                      claim_expires_at=NowPlusSeconds(-1))
        assert lifecycle.reap_expired_claims_once(100).requeued == 1
    elif ending == "retry":  # a retryable failure, claimable again after its backoff
        lifecycle.report_status(job.id, claim["claim_id"], states.FAILURE, retry=True)
        Job.objects.filter(id=job.id).update(available_at=NowPlusSeconds(-1))
    else:
        lifecycle.requeue_job(job.id)
    assert Job.objects.get(id=job.id).status == states.QUEUED
    nxt = _claim(world, job)
    assert nxt["attempt"] == 2 and nxt["checkpoint"] == {"step": 4}


def test_a_progress_report_checkpoint_is_handed_over_too(world):
    job = JobFactory(job_agent=world.agent)
    claim = _claim(world, job)
    r = _progress(world, job, claim["claim_id"], [1, 2, 3])
    assert r.status_code == 200 and "checkpoint" not in r.json()
    lifecycle.release_job(job.id, claim["claim_id"])
    assert _claim(world, job)["checkpoint"] == [1, 2, 3]


def test_a_stale_holders_checkpoint_is_refused(world):
    job = JobFactory(job_agent=world.agent)
    old = _claim(world, job)
    _beat(world, job, old["claim_id"], "old-1")
    lifecycle.release_job(job.id, old["claim_id"])
    new = _claim(world, job)
    assert new["checkpoint"] == "old-1"
    assert _beat(world, job, new["claim_id"], "new-1").status_code == 200
    r = _beat(world, job, old["claim_id"], "old-2")
    assert r.status_code == 409 and r.json()["code"] == "claim_superseded"
    r = _progress(world, job, old["claim_id"], "old-3")
    assert r.status_code == 409 and r.json()["code"] == "claim_superseded"
    saved = JobCheckpoint.objects.get(job_id=job.id)
    assert saved.data == "new-1" and saved.attempt == 2


def test_an_expired_lease_saves_no_checkpoint_by_heartbeat(world):
    job = JobFactory(job_agent=world.agent)
    claim = _claim(world, job)
    JobClaim.objects.filter(job_id=job.id).update(claim_expires_at=NowPlusSeconds(-5))
    r = _beat(world, job, claim["claim_id"], {"x": 1})
    assert r.status_code == 409 and r.json()["code"] == "lease_expired"
    assert not JobCheckpoint.objects.exists()
    # A progress report is still accepted until the reaper takes the claim.
    assert _progress(world, job, claim["claim_id"], {"x": 2}).status_code == 200
    assert JobCheckpoint.objects.get(job_id=job.id).data == {"x": 2}


@override_settings(JOBQUEUE={"MAX_CHECKPOINT_BYTES": 64})
def test_a_checkpoint_over_the_limit_is_a_400_that_changes_nothing(world):
    job = JobFactory(job_agent=world.agent)
    claim = _claim(world, job)
    expires = JobClaim.objects.get(job_id=job.id).claim_expires_at
    for r in (_beat(world, job, claim["claim_id"], {"blob": "x" * 100}),
              _progress(world, job, claim["claim_id"], {"blob": "x" * 100})):
        assert r.status_code == 400 and r.json()["fields"] == {"checkpoint": [
            "Must be at most 64 bytes of JSON."]}
    assert not JobCheckpoint.objects.exists()
    assert JobClaim.objects.get(job_id=job.id).claim_expires_at == expires


def test_a_terminal_report_carries_no_checkpoint(world):
    job = JobFactory(job_agent=world.agent)
    claim = _claim(world, job)
    r = _progress(world, job, claim["claim_id"], {"x": 1}, status="successful")
    assert r.status_code == 400 and "checkpoint" in r.json()["fields"]
    assert Job.objects.get(id=job.id).status == states.IN_PROGRESS
    # null means "none given": the report goes through.
    r = _progress(world, job, claim["claim_id"], None, status="successful")
    assert r.status_code == 200 and r.json()["status"] == "successful"


def test_an_idempotent_claim_replay_returns_the_checkpoint(world):
    job = JobFactory(job_agent=world.agent)
    first = _claim(world, job)
    _beat(world, job, first["claim_id"], "cp")
    lifecycle.release_job(job.id, first["claim_id"])
    caller = world.agent_caller().with_headers({"Authorization": f"Bearer {world.token}",
                                                "Idempotency-Key": "k"})
    a = caller.post(f"job-agents/{world.agent.id}/jobs/claim").json()
    b = caller.post(f"job-agents/{world.agent.id}/jobs/claim").json()
    assert a["claim"]["checkpoint"] == b["claim"]["checkpoint"] == "cp"
    assert a["claim"]["claim_id"] == b["claim"]["claim_id"]


def test_the_lifecycle_refuses_what_is_not_json():
    from jobqueue.exceptions import InvalidInput
    from jobqueue.lifecycle import inputs

    with pytest.raises(InvalidInput):
        inputs.checkpoint({"x": float("nan")})
    with pytest.raises(InvalidInput):
        inputs.checkpoint({"x": object()})
    assert inputs.checkpoint(None) is None


def test_the_workspace_key_may_save_a_checkpoint(world):
    job = JobFactory(job_agent=world.agent)
    claim = _claim(world, job)
    r = world.producer().post(f"jobs/{job.id}/heartbeat",
                              json={"claim_id": claim["claim_id"], "checkpoint": 1})
    assert r.status_code == 200
    assert JobCheckpoint.objects.get(job_id=job.id).data == 1
    other = world.other_agent
    foreign = JobFactory(job_agent=other)
    fclaim = lifecycle.claim_job(other, foreign.id)
    r = world.agent_caller().post(f"jobs/{foreign.id}/heartbeat",
                                  json={"claim_id": str(fclaim.claim_id), "checkpoint": 1})
    assert r.status_code == 404
    assert not JobCheckpoint.objects.filter(job_id=foreign.id).exists()
