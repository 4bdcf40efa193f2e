"""The ends that the clocks and retries add (docs/clocks.md) announce themselves like every
other end (docs/completion.md): job_finished once after commit and one outbox row per
endpoint, for a retryable failure on its last attempt, an attempt past max_runtime_seconds on
its last attempt, and a job past expires_at; a retry that queues the job again announces
nothing. Both databases: the PostgreSQL statements write the outbox rows themselves."""

import threading

import pytest
from django.db import transaction

from jobqueue import lifecycle, signals, states
from jobqueue.actors import REAPER
from jobqueue.db import NowPlusSeconds
from jobqueue.lifecycle.finished import announce_retrying
from jobqueue.maintenance import webhooks
from jobqueue.models import Job, JobClaim, WebhookDelivery
from tests.factories import JobAgentFactory, claimed_job

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def heard():
    calls, lock = [], threading.Lock()

    def receiver(sender, job_id, status, actor, **kwargs):
        with lock:
            calls.append((job_id, status, actor))

    signals.job_finished.connect(receiver, weak=False, dispatch_uid="test-clocks-heard")
    yield calls
    signals.job_finished.disconnect(dispatch_uid="test-clocks-heard")


@pytest.fixture
def retrying():
    calls, lock = [], threading.Lock()

    def receiver(sender, job_id, attempt, available_at, actor, **kwargs):
        assert sender is Job and set(kwargs) == {"signal"}
        with lock:
            calls.append((job_id, attempt, available_at, actor))

    signals.job_retrying.connect(receiver, weak=False, dispatch_uid="test-clocks-retrying")
    yield calls
    signals.job_retrying.disconnect(dispatch_uid="test-clocks-retrying")


@pytest.fixture
def agent():
    agent = JobAgentFactory(max_attempts=2)
    webhooks.create_endpoint(agent.workspace.id, "http://127.0.0.1:9/hook", [])
    return agent


def outbox():
    return sorted(WebhookDelivery.objects.values_list("job_id", flat=True))


def test_a_retry_with_attempts_left_announces_nothing_and_the_last_one_ends_the_job(
        heard, agent):
    job, grant = claimed_job(job_agent=agent, max_attempts=2)
    again = lifecycle.report_status(job.id, grant.claim_id, states.FAILURE, retry=True,
                                    job_agent_id=agent.id)
    assert again.status == states.QUEUED and heard == [] and outbox() == []
    Job.objects.filter(id=job.id).update(available_at=NowPlusSeconds(-1))  # backoff elapsed
    second = lifecycle.claim_job(agent, job.id)
    last = lifecycle.report_status(job.id, second.claim_id, states.FAILURE, retry=True,
                                   job_agent_id=agent.id)
    assert last.status == states.FAILURE
    assert heard == [(job.id, states.FAILURE, f"agent:{agent.id}")]
    assert outbox() == [job.id]


def test_a_batch_of_retries_announces_only_the_jobs_it_ended(heard, agent):
    first, g1 = claimed_job(job_agent=agent, max_attempts=2)
    final, g2 = claimed_job(job_agent=agent, max_attempts=1)
    result = lifecycle.report_many(agent.id, [
        lifecycle.ReportItem(first.id, g1.claim_id, states.FAILURE, retry=True),
        lifecycle.ReportItem(final.id, g2.claim_id, states.FAILURE, retry=True),
    ])
    assert [r.status for r in result.results] == [states.QUEUED, states.FAILURE]
    assert heard == [(final.id, states.FAILURE, f"agent:{agent.id}")]
    assert outbox() == [final.id]


def test_the_reaper_announces_a_runtime_end_on_the_last_attempt_and_an_overdue_job(
        heard, agent):
    overran, _ = claimed_job(job_agent=agent, max_attempts=1, max_runtime_seconds=60)
    retried, _ = claimed_job(job_agent=agent, max_attempts=2, max_runtime_seconds=60)
    JobClaim.objects.filter(job_id__in=[overran.id, retried.id]).update(
        deadline_at=NowPlusSeconds(-1), claim_expires_at=NowPlusSeconds(-1))
    result = lifecycle.reap_expired_claims_once(10)
    assert (result.requeued, result.expired) == (1, 1)
    assert heard == [(overran.id, states.EXPIRED, REAPER)]
    waiting, _ = lifecycle.create_job(workspace=agent.workspace, job_agent=agent)
    Job.objects.filter(id=waiting.id).update(expires_at=NowPlusSeconds(-1))
    assert lifecycle.expire_overdue_jobs_once(10).expired == 1
    assert Job.objects.get(id=waiting.id).status == states.EXPIRED
    assert heard[1:] == [(waiting.id, states.EXPIRED, REAPER)]
    assert outbox() == sorted([overran.id, waiting.id])
    assert lifecycle.expire_overdue_jobs_once(10).expired == 0 and len(heard) == 2


@pytest.mark.parametrize("batch", [False, True])
def test_job_retrying_is_sent_once_per_requeued_retry_and_never_for_the_last(
        heard, retrying, agent, batch):
    job, grant = claimed_job(job_agent=agent, max_attempts=2)

    def fail(claim_id):
        if batch:
            lifecycle.report_many(agent.id, [lifecycle.ReportItem(job.id, claim_id,
                                                                  states.FAILURE, retry=True)])
        else:
            lifecycle.report_status(job.id, claim_id, states.FAILURE, retry=True,
                                    job_agent_id=agent.id)

    fail(grant.claim_id)
    queued = Job.objects.get(id=job.id)
    assert retrying == [(job.id, 1, queued.available_at, f"agent:{agent.id}")]
    assert heard == []
    fail(grant.claim_id)  # the same report again (a lost answer): no news
    assert len(retrying) == 1
    Job.objects.filter(id=job.id).update(available_at=NowPlusSeconds(-1))
    second = lifecycle.claim_job(agent, job.id)
    fail(second.claim_id)  # the last attempt: it ends the job
    assert len(retrying) == 1
    assert heard == [(job.id, states.FAILURE, f"agent:{agent.id}")]


def test_announcing_no_retried_jobs_sends_nothing_and_queues_nothing(retrying):
    with transaction.atomic():
        announce_retrying([])
        assert transaction.get_connection().run_on_commit == []
    assert retrying == []
