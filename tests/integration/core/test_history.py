"""A job's attempts, derived from its timeline (jobqueue.history): every way an attempt ends,
and that deriving them writes nothing on the claim/report hot path."""

import datetime as dt

import pytest
from django.db.models import F

from jobqueue import history, lifecycle, states, timeline
from jobqueue.db import NowPlusSeconds
from jobqueue.models import Job, JobClaim
from tests.factories import JobAgentFactory

pytestmark = pytest.mark.django_db(transaction=True)


def run(agent, job):
    return lifecycle.claim_job(agent, job.id)


def outcomes(job):
    return [(a.number, a.outcome, a.message) for a in history.attempts(Job.objects.get(id=job.id))]


def test_every_way_an_attempt_ends_is_its_outcome():
    agent = JobAgentFactory(max_attempts=20)
    job, _ = lifecycle.create_job(workspace=agent.workspace, job_agent=agent,
                                  max_runtime_seconds=30)
    assert history.attempts(Job.objects.get(id=job.id)) == []
    g = run(agent, job)  # 1: a retryable failure
    lifecycle.report_status(job.id, g.claim_id, states.FAILURE, message="x" * 300, retry=True)
    Job.objects.filter(id=job.id).update(available_at=NowPlusSeconds(-1))
    g = run(agent, job)  # 2: released
    lifecycle.release_job(job.id, g.claim_id, reason="shutting down")
    g = run(agent, job)  # 3: the lease ran out
    JobClaim.objects.filter(job_id=job.id).update(claim_expires_at=NowPlusSeconds(-1))
    lifecycle.reap_expired_claims_once(10)
    g = run(agent, job)  # 4: max_runtime_seconds
    past = dt.timedelta(seconds=31)
    JobClaim.objects.filter(job_id=job.id).update(deadline_at=F("deadline_at") - past,
                                                  claim_expires_at=F("claim_expires_at") - past)
    lifecycle.reap_expired_claims_once(10)
    g = run(agent, job)  # 5: an operator requeued it while it ran
    lifecycle.requeue_job(job.id, reason="stuck")
    g = run(agent, job)  # 6: the agent's final report
    lifecycle.report_status(job.id, g.claim_id, states.SUCCESSFUL, message="done")
    lifecycle.requeue_job(job.id)  # a requeue of a finished job ends no attempt
    g = run(agent, job)  # 7: still running
    assert outcomes(job) == [
        (1, "retrying", "x" * timeline.MESSAGE_CHARS),
        (2, "released", "shutting down"),
        (3, "reaped", "The lease expired."),
        (4, "timed_out", "max_runtime_seconds passed."),
        (5, "superseded", "stuck"),
        (6, "successful", "done"),
        (7, None, ""),
    ]
    attempts = history.attempts(Job.objects.get(id=job.id))
    assert attempts[-1].ended_at is None and attempts[-1].claimed_by == f"agent:{agent.id}"
    assert all(a.ended_at >= a.claimed_at for a in attempts[:-1])


@pytest.mark.parametrize(("end", "outcome"), [
    ("cancel", "cancelled"), ("mark_failed", "superseded"), ("report_cancelled", "cancelled"),
    ("failure", "failure"), ("last_retry", "failure"), ("lease_last", "reaped"),
    ("expires_at", "timed_out"),
])
def test_each_final_end(end, outcome):
    agent = JobAgentFactory(max_attempts=1)
    job, _ = lifecycle.create_job(workspace=agent.workspace, job_agent=agent)
    g = run(agent, job)
    if end == "cancel":
        lifecycle.cancel_job(job.id, reason="no longer needed")
    elif end == "mark_failed":
        lifecycle.mark_failed(job.id, reason="bad input")
    elif end == "report_cancelled":
        lifecycle.report_status(job.id, g.claim_id, states.CANCELLED)
    elif end == "failure":
        lifecycle.report_status(job.id, g.claim_id, states.FAILURE, message="boom")
    elif end == "last_retry":
        lifecycle.report_status(job.id, g.claim_id, states.FAILURE, retry=True)
    elif end == "lease_last":
        JobClaim.objects.filter(job_id=job.id).update(claim_expires_at=NowPlusSeconds(-1))
        lifecycle.reap_expired_claims_once(10)
    else:
        Job.objects.filter(id=job.id).update(expires_at=NowPlusSeconds(-1))
        JobClaim.objects.filter(job_id=job.id).update(claim_expires_at=NowPlusSeconds(-1),
                                                      deadline_at=NowPlusSeconds(-1))
        lifecycle.reap_expired_claims_once(10)
    [(number, got, message)] = outcomes(job)
    assert number == 1 and got == outcome
    if end == "expires_at":
        assert message == "expires_at passed."
    if end == "failure":
        assert message == "boom"


def test_attempts_are_never_written_on_the_hot_path(django_assert_max_num_queries):
    """Deriving attempts adds no write (a claim and a report stay one statement each on
    PostgreSQL: test_pg_fastpath), and reading them is two queries: the events, and for a
    finished job whether a stored event ended its last claim (jobqueue/timeline.py)."""
    agent = JobAgentFactory()
    job, _ = lifecycle.create_job(workspace=agent.workspace, job_agent=agent)
    g = run(agent, job)
    lifecycle.report_status(job.id, g.claim_id, states.SUCCESSFUL, job_agent_id=agent.id)
    job = Job.objects.get(id=job.id)
    with django_assert_max_num_queries(2):
        assert [a.outcome for a in history.attempts(job)] == ["successful"]
