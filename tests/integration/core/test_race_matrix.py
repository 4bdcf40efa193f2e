"""Every pair of transitions that can meet on one job, raced by real threads, round after
round: whatever the interleaving, the invariants hold afterwards.

- in_progress <=> exactly one claim row, and that claim is the job's last claim;
- a terminal job has completed_at and no claim; attempt never goes down;
- the loser of each race gets a domain error with a stable code (never a crash).
"""

import random
import time

import pytest

from jobqueue import lifecycle, states
from jobqueue.db import NowPlusSeconds
from jobqueue.exceptions import JobQueueError
from jobqueue.models import Job, JobAgent, JobClaim, JobEvent
from tests.factories import JobAgentFactory, JobFactory
from tests.utils import run_threads, timeline_events

pytestmark = pytest.mark.django_db(transaction=True)

ROUNDS = 8


def check_invariants(job_id, min_attempt):
    job = Job.objects.get(id=job_id)
    claims = list(JobClaim.objects.filter(job_id=job_id))
    if job.status == states.IN_PROGRESS:
        assert len(claims) == 1 and claims[0].claim_id == job.last_claim_id
        assert claims[0].attempt == job.attempt
    else:
        assert claims == []
    assert (job.completed_at is not None) == (job.status in states.TERMINAL)
    assert job.attempt >= min_attempt
    return job


def _ops(agent, job_id, grant):
    def claim():
        return lifecycle.claim_job(JobAgent.objects.get(id=agent.id), job_id)

    return {
        "claim": claim,
        "claim_next": lambda: lifecycle.claim_next_job(JobAgent.objects.get(id=agent.id)),
        "heartbeat": lambda: lifecycle.heartbeat(job_id, grant.claim_id),
        "succeed": lambda: lifecycle.report_status(job_id, grant.claim_id, states.SUCCESSFUL),
        "fail": lambda: lifecycle.report_status(job_id, grant.claim_id, states.FAILURE),
        "release": lambda: lifecycle.release_job(job_id, grant.claim_id),
        "cancel": lambda: lifecycle.cancel_job(job_id, actor="operator:t"),
        "requeue": lambda: lifecycle.requeue_job(job_id, actor="operator:t"),
        "mark_failed": lambda: lifecycle.mark_failed(job_id, actor="operator:t"),
        "reap": lambda: lifecycle.reap_expired_claims_once(50),
    }


PAIRS = [
    ("succeed", "reap"),
    ("release", "reap"),
    ("succeed", "cancel"),
    ("succeed", "requeue"),
    ("heartbeat", "cancel"),
    ("heartbeat", "requeue"),
    ("release", "cancel"),
    ("fail", "mark_failed"),
    ("succeed", "succeed"),
    ("cancel", "requeue"),
    ("claim", "cancel"),
    ("claim_next", "requeue"),
    ("claim", "claim_next"),
]


@pytest.mark.parametrize("first,second", PAIRS, ids=[f"{a}-vs-{b}" for a, b in PAIRS])
def test_racing_transitions_keep_invariants(first, second):
    agent = JobAgentFactory(max_attempts=50)
    for _ in range(ROUNDS):
        job = JobFactory(job_agent=agent)
        grant = None
        if "claim" not in (first, second) and "claim_next" not in (first, second):
            grant = lifecycle.claim_job(agent, job.id)
            # Straddle the lease's expiry so that the reaper has something to race for.
            JobClaim.objects.filter(job=job).update(
                claim_expires_at=NowPlusSeconds(random.choice([-1, 0.01]))
            )
        ops = _ops(agent, job.id, grant)

        def caller(i, barrier, ops=ops):
            barrier.wait()
            time.sleep(random.uniform(0, 0.01))
            try:
                ops[(first, second)[i]]()
                return "ok"
            except JobQueueError as exc:
                return exc.code

        outcomes = run_threads(caller, 2)
        assert all(isinstance(o, str) for o in outcomes)
        final = check_invariants(job.id, min_attempt=1 if grant else 0)
        if (first, second) in {("succeed", "cancel"), ("fail", "mark_failed")}:
            # Two ways to end the job: exactly one of them does.
            assert outcomes.count("ok") == 1, outcomes
        if (first, second) == ("succeed", "succeed"):
            assert outcomes == ["ok", "ok"]  # the second is an identical retry
            assert len(timeline_events(job.id, JobEvent.STATUS_REPORTED)) == 1
        if first == "succeed" and outcomes[0] == "ok" and second != "requeue":
            assert final.status == states.SUCCESSFUL
        if "heartbeat" == first and outcomes[0] == "ok" and outcomes[1] == "ok":
            # The operator won after the heartbeat: the lease went with the job.
            assert not JobClaim.objects.filter(job=job, claim_id=grant.claim_id).exists()
    # Nothing leaked: each job is either finished, queued or held by its one claim.
    assert JobClaim.objects.count() == Job.objects.filter(status=states.IN_PROGRESS).count()


def test_idempotent_create_races_to_one_job():
    agent = JobAgentFactory()

    def create(i, barrier):
        barrier.wait()
        job, created = lifecycle.create_job(
            workspace=agent.workspace, job_agent=agent,
            dispatch_context={"x": 1}, idempotency_key="same-key",
        )
        return job.id, created

    results = run_threads(create, 6)
    assert len({job_id for job_id, _ in results}) == 1
    assert sum(created for _, created in results) == 1
    assert Job.objects.count() == 1
