"""jobqueue.signals.job_finished: sent once per terminal transition, after its commit, from
every path that ends a job (single report, batch report, reaper, operator cancel and mark
failed, the admin), never for a write that changed nothing, and exactly once when callers race
for the same job (threads with their own connections, on both databases)."""

import logging
import threading
from collections import Counter

import pytest
from django.db import transaction

from jobqueue import lifecycle, signals, states
from jobqueue.actors import REAPER
from jobqueue.db import NowPlusSeconds
from jobqueue.exceptions import Conflict, JobFinished
from jobqueue.models import Job, JobClaim
from tests.factories import JobAgentFactory, JobFactory, claimed_job
from tests.utils import run_threads

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def heard():
    calls, lock = [], threading.Lock()

    def receiver(sender, job_id, status, actor, **kwargs):
        assert sender is Job and set(kwargs) == {"signal"}  # never dispatch_context
        with lock:
            calls.append((job_id, status, actor, transaction.get_connection().in_atomic_block))

    signals.job_finished.connect(receiver, weak=False, dispatch_uid="test-heard")
    yield calls
    signals.job_finished.disconnect(dispatch_uid="test-heard")


def ended(calls):
    return [(job_id, status) for job_id, status, _actor, _atomic in calls]


def expire(job):
    JobClaim.objects.filter(job=job).update(claim_expires_at=NowPlusSeconds(-1))


@pytest.mark.parametrize("status", [states.SUCCESSFUL, states.FAILURE, states.CANCELLED])
def test_a_terminal_report_sends_once_after_commit_and_a_retry_sends_nothing(heard, status):
    job, grant = claimed_job()
    lifecycle.report_status(job.id, grant.claim_id, states.IN_PROGRESS, message="half")
    assert heard == []  # progress is not an end
    lifecycle.report_status(job.id, grant.claim_id, status, job_agent_id=job.job_agent_id)
    assert heard == [(job.id, status, f"agent:{job.job_agent_id}", False)]  # after commit
    lifecycle.report_status(job.id, grant.claim_id, status)  # a retry after a lost answer
    with pytest.raises(Conflict):
        lifecycle.report_status(job.id, grant.claim_id, states.FAILURE if
                                status != states.FAILURE else states.SUCCESSFUL)
    assert len(heard) == 1


def test_a_batch_report_sends_once_per_job_it_ended(heard):
    agent = JobAgentFactory()
    JobFactory.create_batch(3, job_agent=agent)
    grants = lifecycle.claim_next_jobs(agent, 3)
    stale, = [g for g in grants[2:]]
    lifecycle.cancel_job(stale.job.id, actor="operator:ann")
    heard.clear()
    items = [lifecycle.ReportItem(grants[0].job.id, grants[0].claim_id, states.SUCCESSFUL),
             lifecycle.ReportItem(grants[1].job.id, grants[1].claim_id, states.FAILURE),
             lifecycle.ReportItem(stale.job.id, stale.claim_id, states.SUCCESSFUL)]
    result = lifecycle.report_many(agent.id, items)
    assert [r.accepted for r in result.results] == [True, True, False]
    assert sorted(ended(heard)) == sorted([(grants[0].job.id, states.SUCCESSFUL),
                                           (grants[1].job.id, states.FAILURE)])
    assert {actor for _j, _s, actor, _a in heard} == {f"agent:{agent.id}"}
    lifecycle.report_many(agent.id, items[:2])  # the same batch again: retries, no news
    assert len(heard) == 2


def test_the_reaper_sends_for_a_job_it_expires_not_for_one_it_requeues(heard):
    last, last_grant = claimed_job(job_agent=JobAgentFactory(max_attempts=1), max_attempts=1)
    again, _ = claimed_job()
    expire(last)
    expire(again)
    result = lifecycle.reap_expired_claims_once(10)
    assert (result.requeued, result.expired) == (1, 1)
    assert heard == [(last.id, states.EXPIRED, REAPER, False)]
    assert lifecycle.reap_expired_claims_once(10).reaped == 0
    assert len(heard) == 1


def test_operator_cancel_and_mark_failed_send_once_and_requeue_sends_nothing(heard):
    running, _ = claimed_job()
    queued = JobFactory()
    lifecycle.cancel_job(running.id, actor="operator:ann")
    lifecycle.cancel_job(running.id, actor="operator:ann")  # cancelling a cancelled job
    lifecycle.mark_failed(queued.id, actor="operator:bob", reason="bad input")
    with pytest.raises(JobFinished):
        lifecycle.mark_failed(queued.id)
    assert [(j, s, a) for j, s, a, _ in heard] == [
        (running.id, states.CANCELLED, "operator:ann"), (queued.id, states.FAILURE, "operator:bob")]
    lifecycle.requeue_job(running.id, actor="operator:ann")
    assert len(heard) == 2
    grant = lifecycle.claim_job(running.job_agent, running.id)
    lifecycle.report_status(running.id, grant.claim_id, states.SUCCESSFUL)  # a second life
    assert ended(heard)[-1] == (running.id, states.SUCCESSFUL) and len(heard) == 3


def test_nothing_is_sent_when_the_transition_rolls_back(heard):
    job, grant = claimed_job()

    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():
        lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL)
        assert heard == []  # not before the commit
        raise Abort
    assert heard == [] and Job.objects.get(id=job.id).status == states.IN_PROGRESS
    with transaction.atomic():
        lifecycle.cancel_job(job.id)
        assert heard == []
    assert ended(heard) == [(job.id, states.CANCELLED)]


def test_a_failing_receiver_is_logged_and_the_others_still_hear(heard, caplog):
    def broken(sender, **kwargs):
        raise RuntimeError("receiver bug")

    signals.job_finished.connect(broken, weak=False, dispatch_uid="test-broken")
    try:
        jobs = [claimed_job() for _ in range(2)]
        with caplog.at_level(logging.ERROR, logger="django.dispatch"):
            for job, grant in jobs:
                lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL)
    finally:
        signals.job_finished.disconnect(dispatch_uid="test-broken")
    assert len(heard) == 2
    assert all(Job.objects.get(id=j.id).status == states.SUCCESSFUL for j, _ in jobs)
    assert "receiver bug" in caplog.text


def test_the_documented_receiver_creates_the_load_job_after_the_extract(heard):
    # The example of jobqueue/signals.py and docs/signals.md, as written there.
    def load_after_extract(sender, job_id, status, **kwargs):
        job = Job.objects.select_related("job_agent", "workspace").get(id=job_id)
        if status == states.SUCCESSFUL and job.job_agent_config.get("step") == "extract":
            lifecycle.create_job(workspace=job.workspace, job_agent=job.job_agent,
                                 job_agent_config={"step": "load", "after": str(job.id)},
                                 idempotency_key=f"load-after-{job.id}")

    signals.job_finished.connect(load_after_extract, weak=False, dispatch_uid="test-load")
    try:
        agent = JobAgentFactory()
        extract = JobFactory(job_agent=agent, job_agent_config={"step": "extract"})
        other = JobFactory(job_agent=agent, job_agent_config={"step": "other"})
        for job in (extract, other):
            grant = lifecycle.claim_job(agent, job.id)
            lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL)
    finally:
        signals.job_finished.disconnect(dispatch_uid="test-load")
    load = Job.objects.get(job_agent_config__step="load")
    assert load.status == states.QUEUED and load.job_agent_config["after"] == str(extract.id)
    assert Job.objects.count() == 3


# Racing callers: whoever wins, exactly one job_finished per job.

def test_racing_identical_reports_send_once(heard):
    jobs = [claimed_job() for _ in range(10)]

    def reporter(i, barrier):
        for job, grant in jobs:
            barrier.wait()
            lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL)

    run_threads(reporter, 4)
    assert Counter(job_id for job_id, *_ in heard) == {job.id: 1 for job, _ in jobs}


def test_a_report_racing_cancel_and_the_reaper_ends_the_job_once(heard):
    agent = JobAgentFactory(max_attempts=1)
    jobs = [claimed_job(job_agent=agent, max_attempts=1) for _ in range(10)]
    for job, _ in jobs:
        expire(job)  # the reaper may end it too; the report is still accepted until then

    def racer(i, barrier):
        for job, grant in jobs:
            barrier.wait()
            try:
                if i == 0:
                    lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL)
                elif i == 1:
                    lifecycle.report_many(agent.id, [lifecycle.ReportItem(
                        job.id, grant.claim_id, states.FAILURE)])
                elif i == 2:
                    lifecycle.cancel_job(job.id)
                else:
                    lifecycle.reap_expired_claims_once(10)
            except (Conflict, JobFinished):
                pass

    run_threads(racer, 4)
    assert Counter(job_id for job_id, *_ in heard) == {job.id: 1 for job, _ in jobs}
    final = dict(Job.objects.filter(id__in=[j.id for j, _ in jobs]).values_list("id", "status"))
    assert {job_id: status for job_id, status, *_ in heard} == final
