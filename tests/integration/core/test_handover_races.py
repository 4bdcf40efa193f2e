"""Claim handover under racing callers: named claims at an expected attempt, and the
read-only reconciliation racing the writes it describes."""

import pytest

from jobqueue import lifecycle, states
from jobqueue.exceptions import JobNotClaimable
from jobqueue.models import Job, JobAgent, JobClaim, JobEvent
from tests.factories import JobAgentFactory, JobFactory
from tests.utils import run_threads, timeline_events

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.postgres_only
def test_named_claims_at_the_expected_attempt_hand_the_job_out_once():
    agent = JobAgentFactory()
    job = JobFactory(job_agent=agent)

    def worker(i, barrier):
        me = JobAgent.objects.get(id=agent.id)
        barrier.wait()
        try:
            grant = lifecycle.claim_job(me, job.id, holder=f"host:{i}", expected_attempt=0)
        except JobNotClaimable:
            return None
        return grant.claim_id

    results = run_threads(worker, 12)
    won = [r for r in results if r is not None]
    assert len(won) == 1
    claim = JobClaim.objects.get(job_id=job.id)
    assert claim.claim_id == won[0] and claim.holder.startswith("host:")
    assert Job.objects.get(id=job.id).attempt == 1
    assert len(timeline_events(job.id, JobEvent.CLAIMED)) == 1


@pytest.mark.postgres_only
def test_reconciliation_racing_reports_and_heartbeats_never_writes_and_agrees():
    agent = JobAgentFactory()
    jobs = [JobFactory(job_agent=agent) for _ in range(30)]
    grants = {j.id: lifecycle.claim_job(agent, j.id) for j in jobs}
    events_before = JobEvent.objects.count()

    def worker(i, barrier):
        barrier.wait()
        seen = []
        for job_id, grant in grants.items():
            if i == 0:
                lifecycle.heartbeat(job_id, grant.claim_id)
                lifecycle.report_status(job_id, grant.claim_id, states.SUCCESSFUL)
            else:
                check = lifecycle.claim_state(job_id, grant.claim_id)
                seen.append((job_id, check.current, check.code, check.final_status))
        return seen

    results = run_threads(worker, 4)
    for seen in results[1:]:
        for _job_id, current, code, final_status in seen:
            # Either still current, or finished by this very claim: nothing in between.
            assert current or (code == "job_finished" and final_status == "successful")
    # Only the reports wrote events (a status_reported each); the reads wrote nothing.
    assert JobEvent.objects.count() == events_before + len(jobs)


@pytest.mark.postgres_only
@pytest.mark.parametrize("limit", [1, 3])
def test_retries_with_one_key_racing_each_other_get_one_grant(limit):
    agent = JobAgentFactory()
    for _ in range(10):
        JobFactory(job_agent=agent)

    def worker(i, barrier):
        me = JobAgent.objects.get(id=agent.id)
        barrier.wait()
        grants = lifecycle.claim_next_jobs(me, limit, idempotency_key="lost-answer")
        return sorted(str(g.claim_id) for g in grants)

    results = run_threads(worker, 8)
    assert len({tuple(r) for r in results}) == 1 and len(results[0]) == limit
    assert JobClaim.objects.count() == limit
    assert Job.objects.filter(status=states.IN_PROGRESS).count() == limit


@pytest.mark.postgres_only
def test_a_stale_holder_racing_the_handover_never_overwrites_the_new_checkpoint():
    """The old holder keeps saving checkpoints while its claim is released and the job
    claimed again; the new holder saves too. Only accepted writes count, and the newest
    attempt's checkpoint is never replaced by an older attempt's."""
    from jobqueue.exceptions import Conflict
    from jobqueue.models import JobCheckpoint

    agent = JobAgentFactory()
    job = JobFactory(job_agent=agent)
    old = lifecycle.claim_job(agent, job.id)
    handed = {}

    def worker(i, barrier):
        barrier.wait()
        accepted = 0
        if i == 0:  # the old holder
            for k in range(200):
                try:
                    lifecycle.heartbeat(job.id, old.claim_id, checkpoint={"by": "old", "k": k})
                    accepted += 1
                except Conflict:
                    break
            return accepted
        if i == 1:  # the handover, then the new holder
            lifecycle.release_job(job.id, old.claim_id)
            new = lifecycle.claim_job(JobAgent.objects.get(id=agent.id), job.id)
            handed["checkpoint"] = new.checkpoint
            for k in range(50):
                lifecycle.heartbeat(job.id, new.claim_id, checkpoint={"by": "new", "k": k})
            return new.attempt
        return None

    results = run_threads(worker, 2)
    saved = JobCheckpoint.objects.get(job_id=job.id)
    assert saved.attempt == results[1] == 2
    assert saved.data == {"by": "new", "k": 49}
    # The new attempt started from the old holder's last accepted checkpoint (or none).
    if results[0]:
        assert handed["checkpoint"] == {"by": "old", "k": results[0] - 1}
    else:
        assert handed["checkpoint"] is None
    assert Job.objects.get(id=job.id).attempt == 2
