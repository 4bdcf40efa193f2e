"""Retryable failures ({"status": "failure", "retry": true}): queued again after an
exponential backoff measured on the database's clock while attempts remain, else failure;
single and batch, their repeats, and racing callers (on both backends)."""

import pytest

from jobqueue import lifecycle, states
from jobqueue.db import NowPlusSeconds, db_now
from jobqueue.exceptions import ClaimSuperseded, InvalidInput, JobFinished
from jobqueue.models import Job, JobClaim, JobEvent
from tests.factories import JobAgentFactory, JobFactory, claimed_job
from tests.utils import final_state_is_consistent, run_threads, timeline_events

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def backoff(settings):
    def configure(base=10, cap=3600, jitter=0.0):
        settings.JOBQUEUE = {**settings.JOBQUEUE, "RETRY_BACKOFF_SECONDS": base,
                             "MAX_RETRY_BACKOFF_SECONDS": cap, "RETRY_JITTER": jitter}
    configure()
    return configure


def claimed_on_attempt(attempt, max_attempts=5, **fields):
    """A job claimed for its `attempt`th time."""
    job = JobFactory(max_attempts=max_attempts, initial_max_attempts=max_attempts, **fields)
    Job.objects.filter(id=job.id).update(attempt=attempt - 1)
    grant = lifecycle.claim_job(job.job_agent, job.id)
    assert grant.attempt == attempt
    return grant.job, grant


def waited(job) -> float:
    """How long after the report (its updated_at) the job becomes claimable."""
    return (job.available_at - job.updated_at).total_seconds()


def reported(job):
    return [e.detail for e in timeline_events(job.id, JobEvent.STATUS_REPORTED)]


def test_retry_with_attempts_left_queues_after_the_backoff(backoff):
    job, grant = claimed_on_attempt(1, max_attempts=3)
    t0 = db_now()
    out = lifecycle.report_status(job.id, grant.claim_id, states.FAILURE, message="flaky",
                                  result={"exit": 75}, retry=True)
    assert out.status == states.QUEUED and out.completed_at is None
    assert out.attempt == 1 and out.message == "flaky" and out.result == {"exit": 75}
    assert waited(out) == pytest.approx(10, abs=0.002)
    assert out.available_at >= t0
    assert not JobClaim.objects.filter(job=job).exists()
    assert reported(job) == [{"status": "failure", "has_result": True, "retry": True,
                              "requeued": True, "message": "flaky"}]
    # Not claimable before the backoff, claimable after it (the database's clock).
    assert lifecycle.claim_next_job(job.job_agent) is None
    Job.objects.filter(id=job.id).update(available_at=NowPlusSeconds(-1))
    again = lifecycle.claim_next_job(job.job_agent)
    assert again.job.id == job.id and again.attempt == 2
    final_state_is_consistent()


@pytest.mark.parametrize(("attempt", "base", "cap", "expected"), [
    (1, 10, 3600, 10), (2, 10, 3600, 20), (3, 10, 3600, 40), (4, 10, 3600, 80),
    (9, 10, 3600, 2560), (10, 10, 3600, 3600), (60, 10, 3600, 3600),  # capped, no overflow
    (3, 0, 3600, 0), (2, 7, 10, 10),
])
def test_backoff_doubles_per_attempt_up_to_the_cap(backoff, attempt, base, cap, expected):
    backoff(base=base, cap=cap)
    job, grant = claimed_on_attempt(attempt, max_attempts=100)
    out = lifecycle.report_status(job.id, grant.claim_id, states.FAILURE, retry=True)
    assert out.status == states.QUEUED
    assert waited(out) == pytest.approx(expected, abs=0.002)


def test_the_jobs_own_backoff_overrides_the_default(backoff):
    job, grant = claimed_on_attempt(2, retry_backoff_seconds=3)
    out = lifecycle.report_status(job.id, grant.claim_id, states.FAILURE, retry=True)
    assert waited(out) == pytest.approx(6, abs=0.002)
    assert out.effective_retry_backoff_seconds == 3


def test_jitter_shortens_the_wait_by_at_most_its_fraction(backoff):
    backoff(base=100, jitter=0.5)
    waits = []
    for _ in range(8):
        job, grant = claimed_on_attempt(1)
        waits.append(waited(lifecycle.report_status(job.id, grant.claim_id, states.FAILURE,
                                                    retry=True)))
    assert all(50 - 0.002 <= w <= 100 + 0.002 for w in waits)
    assert len({round(w, 3) for w in waits}) > 1  # it does vary


def test_retry_on_the_last_attempt_ends_failure(backoff):
    job, grant = claimed_on_attempt(3, max_attempts=3)
    before = Job.objects.get(id=job.id).available_at
    out = lifecycle.report_status(job.id, grant.claim_id, states.FAILURE, message="still",
                                  retry=True)
    assert out.status == states.FAILURE and out.completed_at is not None
    assert out.available_at == before
    assert reported(job)[-1]["requeued"] is False
    # Its repeat is answered the same; a release or heartbeat with it is refused.
    again = lifecycle.report_status(job.id, grant.claim_id, states.FAILURE, message="still",
                                    retry=True)
    assert again.status == states.FAILURE and again.completed_at == out.completed_at
    with pytest.raises(JobFinished):
        lifecycle.heartbeat(job.id, grant.claim_id)


def test_without_retry_failure_is_final(backoff):
    job, grant = claimed_on_attempt(1)
    out = lifecycle.report_status(job.id, grant.claim_id, states.FAILURE)
    assert out.status == states.FAILURE and "retry" not in reported(job)[-1]


@pytest.mark.parametrize("status", [states.SUCCESSFUL, states.CANCELLED, states.IN_PROGRESS])
def test_retry_qualifies_a_failure_only(backoff, status):
    job, grant = claimed_job()
    with pytest.raises(InvalidInput) as err:
        lifecycle.report_status(job.id, grant.claim_id, status, retry=True)
    assert err.value.context["field"] == "retry"
    assert Job.objects.get(id=job.id).status == states.IN_PROGRESS
    with pytest.raises(InvalidInput):
        lifecycle.report_many(job.job_agent_id, [
            lifecycle.ReportItem(job.id, grant.claim_id, status, retry=True)])


@pytest.mark.parametrize("value", [-1, 3601, True, "10"])
def test_retry_backoff_seconds_bounds_on_create(backoff, value):
    agent = JobAgentFactory()
    with pytest.raises(InvalidInput):
        lifecycle.create_job(workspace=agent.workspace, job_agent=agent,
                             retry_backoff_seconds=value)
    assert not Job.objects.exists()


def test_repeat_of_a_retry_gets_the_same_answer_until_the_job_is_claimed_again(backoff):
    job, grant = claimed_on_attempt(1)
    first = lifecycle.report_status(job.id, grant.claim_id, states.FAILURE, message="m",
                                    retry=True)
    events = JobEvent.objects.count()
    again = lifecycle.report_status(job.id, grant.claim_id, states.FAILURE, message="m",
                                    retry=True)
    assert (again.status, again.available_at) == (states.QUEUED, first.available_at)
    assert JobEvent.objects.count() == events
    with pytest.raises(JobFinished):  # other content: not taken
        lifecycle.report_status(job.id, grant.claim_id, states.FAILURE, message="n", retry=True)
    with pytest.raises(ClaimSuperseded):  # a final failure after it: the claim ended
        lifecycle.report_status(job.id, grant.claim_id, states.FAILURE, message="m")
    with pytest.raises(ClaimSuperseded):
        lifecycle.heartbeat(job.id, grant.claim_id)
    with pytest.raises(ClaimSuperseded):
        lifecycle.release_job(job.id, grant.claim_id)
    Job.objects.filter(id=job.id).update(available_at=NowPlusSeconds(-1))
    lifecycle.claim_next_job(job.job_agent)
    with pytest.raises(ClaimSuperseded):
        lifecycle.report_status(job.id, grant.claim_id, states.FAILURE, message="m", retry=True)


@pytest.mark.parametrize("first_retry", [False, True])
def test_a_failed_job_repeats_its_failure_only_with_the_same_retry(backoff, first_retry):
    # docs/clocks.md, "Repeats": same claim_id, status, retry and content. A final failure
    # and a retryable failure on the last attempt both leave the job `failure`; a repeat
    # with the other `retry` is not the report taken (409 job_finished), single and batch.
    job, grant = claimed_on_attempt(2, max_attempts=2)
    first = lifecycle.report_status(job.id, grant.claim_id, states.FAILURE, message="m",
                                    retry=first_retry)
    assert first.status == states.FAILURE
    events = JobEvent.objects.count()
    same = lifecycle.report_status(job.id, grant.claim_id, states.FAILURE, message="m",
                                   retry=first_retry)
    assert (same.status, same.completed_at) == (states.FAILURE, first.completed_at)
    with pytest.raises(JobFinished):
        lifecycle.report_status(job.id, grant.claim_id, states.FAILURE, message="m",
                                retry=not first_retry)
    for retry, answer in ((first_retry, (True, None)),
                          (not first_retry, (False, JobFinished.code))):
        batch = lifecycle.report_many(job.job_agent_id, [lifecycle.ReportItem(
            job.id, grant.claim_id, states.FAILURE, message="m", retry=retry)])
        assert [(r.accepted, r.code) for r in batch.results] == [answer]
    assert JobEvent.objects.exclude(kind=JobEvent.STALE_WRITE_REFUSED).count() == events
    final_state_is_consistent()


def test_a_retry_after_the_reaper_requeued_the_job_is_not_taken_for_a_repeat(backoff):
    job, grant = claimed_on_attempt(1)
    JobClaim.objects.filter(job=job).update(claim_expires_at=NowPlusSeconds(-1))
    assert lifecycle.reap_expired_claims_once(10).requeued == 1
    with pytest.raises(ClaimSuperseded):
        lifecycle.report_status(job.id, grant.claim_id, states.FAILURE, retry=True)
    assert reported(job) == []


def test_batch_report_takes_retry(backoff):
    agent = JobAgentFactory(max_attempts=2)
    JobFactory.create_batch(3, job_agent=agent, max_attempts=2, initial_max_attempts=2)
    retried, last, plain = lifecycle.claim_next_jobs(agent, 3)
    Job.objects.filter(id=last.job.id).update(attempt=2)
    items = [
        lifecycle.ReportItem(retried.job.id, retried.claim_id, states.FAILURE, message="t",
                             retry=True),
        lifecycle.ReportItem(last.job.id, last.claim_id, states.FAILURE, retry=True),
        lifecycle.ReportItem(plain.job.id, plain.claim_id, states.SUCCESSFUL),
    ]
    out = lifecycle.report_many(agent.id, items)
    assert [(r.accepted, r.status, r.completed_at is None) for r in out.results] == [
        (True, states.QUEUED, True), (True, states.FAILURE, False),
        (True, states.SUCCESSFUL, False)]
    job = Job.objects.get(id=retried.job.id)
    assert job.status == states.QUEUED and job.message == "t"
    assert waited(job) == pytest.approx(10, abs=0.002)
    assert reported(retried.job) == [{"status": "failure", "has_result": False, "retry": True,
                                      "requeued": True, "message": "t"}]
    assert reported(last.job)[0]["requeued"] is False
    assert reported(plain.job) == [{"status": "successful", "has_result": False}]
    # The repeat of the whole batch: the same answers, nothing new written.
    events = JobEvent.objects.count()
    repeat = lifecycle.report_many(agent.id, items)
    assert [(r.accepted, r.status) for r in repeat.results] == [
        (r.accepted, r.status) for r in out.results]
    assert JobEvent.objects.count() == events
    final_state_is_consistent()


def test_racing_repeats_of_a_retry_take_it_once(backoff):
    job, grant = claimed_on_attempt(1)

    def report(i, barrier):
        barrier.wait()
        if i % 2:
            out = lifecycle.report_many(job.job_agent_id, [lifecycle.ReportItem(
                job.id, grant.claim_id, states.FAILURE, message="m", retry=True)])
            return out.results[0].accepted, out.results[0].status
        return True, lifecycle.report_status(job.id, grant.claim_id, states.FAILURE,
                                             message="m", retry=True).status

    results = run_threads(report, 8)
    assert results == [(True, states.QUEUED)] * 8
    assert len(reported(job)) == 1
    final_state_is_consistent()


def test_retry_racing_the_reaper_one_or_the_other(backoff):
    """A retry report on an expired lease against reapers: exactly one takes the claim."""
    rounds = 10
    grants = []
    for _ in range(rounds):
        job, grant = claimed_on_attempt(1)
        JobClaim.objects.filter(job=job).update(claim_expires_at=NowPlusSeconds(-1))
        grants.append(grant)

    def act(i, barrier):
        barrier.wait()
        if i == 0:
            return sum(lifecycle.reap_expired_claims_once(100).reaped for _ in range(3))
        taken = 0
        for g in grants:
            try:
                lifecycle.report_status(g.job.id, g.claim_id, states.FAILURE, retry=True)
                taken += 1
            except ClaimSuperseded:
                pass
        return taken

    reaped, taken = run_threads(act, 2)
    assert reaped + taken == rounds
    for g in grants:
        job = Job.objects.get(id=g.job.id)
        kinds = [e.kind for e in timeline_events(job.id)]
        assert job.status == states.QUEUED and job.attempt == 1
        assert (JobEvent.REAPED in kinds) != (JobEvent.STATUS_REPORTED in kinds)
    final_state_is_consistent()
