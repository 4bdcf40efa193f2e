"""jobqueue.timeline: which final reports are stored and which are read from the job row, on
the single and the batch path, the requeue that keeps one, and racing requeues."""

import pytest
from django.db import connection, transaction

from jobqueue import lifecycle, states, timeline
from jobqueue.exceptions import JobFinished
from jobqueue.lifecycle import effects
from jobqueue.models import Job, JobEvent
from tests.factories import JobAgentFactory, JobFactory
from tests.utils import run_threads, timeline_events, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def _stored(job_id):
    return list(JobEvent.objects.filter(job_id=job_id, kind=JobEvent.STATUS_REPORTED))


def _claimed(agent, n=1):
    return [lifecycle.claim_job(agent, JobFactory(job_agent=agent).id) for _ in range(n)]


def test_which_single_reports_are_stored():
    agent = JobAgentFactory(max_attempts=3)
    plain, with_result, kept, other, retry = _claimed(agent, 5)
    lifecycle.report_status(plain.job.id, plain.claim_id, states.SUCCESSFUL,
                            job_agent_id=agent.id)
    lifecycle.report_status(with_result.job.id, with_result.claim_id, states.FAILURE,
                            message="boom", result={"exit": 2}, job_agent_id=agent.id)
    # A progress result the final report does not repeat: the row cannot say has_result.
    lifecycle.report_status(kept.job.id, kept.claim_id, states.IN_PROGRESS, result=[1],
                            job_agent_id=agent.id)
    lifecycle.report_status(kept.job.id, kept.claim_id, states.SUCCESSFUL,
                            job_agent_id=agent.id)
    # No agent named (a workspace key on the agent's path): not the row's actor.
    lifecycle.report_status(other.job.id, other.claim_id, states.CANCELLED)
    lifecycle.report_status(retry.job.id, retry.claim_id, states.FAILURE, retry=True,
                            job_agent_id=agent.id)
    assert not _stored(plain.job.id) and not _stored(with_result.job.id)
    assert [e.detail for e in _stored(kept.job.id)] == [{"status": "successful",
                                                         "has_result": False}]
    assert [e.actor for e in _stored(other.job.id)] == [""]
    assert [e.detail for e in _stored(retry.job.id)] == [
        {"status": "failure", "has_result": False, "retry": True, "requeued": True}]
    (derived,) = timeline_events(with_result.job.id, JobEvent.STATUS_REPORTED)
    job = Job.objects.get(id=with_result.job.id)
    assert (derived.detail, derived.attempt, derived.claim_id, derived.created_at,
            derived.actor, derived.id) == (
        {"status": "failure", "has_result": True, "message": "boom"}, 1,
        with_result.claim_id, job.completed_at, f"agent:{agent.id}", None)
    for grant in (plain, with_result, kept, other):
        assert len(timeline_events(grant.job.id, JobEvent.STATUS_REPORTED)) == 1


def test_which_batch_reports_are_stored():
    agent = JobAgentFactory(max_attempts=3)
    plain, messaged, kept, retry = _claimed(agent, 4)
    lifecycle.report_status(kept.job.id, kept.claim_id, states.IN_PROGRESS, message="so far",
                            job_agent_id=agent.id)
    result = lifecycle.report_many(agent.id, [
        lifecycle.ReportItem(plain.job.id, plain.claim_id, states.SUCCESSFUL),
        lifecycle.ReportItem(messaged.job.id, messaged.claim_id, states.FAILURE,
                             message="m" * 300),
        lifecycle.ReportItem(kept.job.id, kept.claim_id, states.SUCCESSFUL),
        lifecycle.ReportItem(retry.job.id, retry.claim_id, states.FAILURE, retry=True),
    ])
    assert all(r.accepted for r in result.results)
    assert not _stored(plain.job.id) and not _stored(messaged.job.id)
    assert [e.detail for e in _stored(kept.job.id)] == [{"status": "successful",
                                                         "has_result": False}]
    assert [e.detail.get("retry") for e in _stored(retry.job.id)] == [True]
    (derived,) = timeline_events(messaged.job.id, JobEvent.STATUS_REPORTED)
    assert derived.detail == {"status": "failure", "has_result": False,
                              "message": "m" * timeline.MESSAGE_CHARS}


def test_a_stored_ending_of_the_last_claim_is_never_doubled():
    agent = JobAgentFactory(max_attempts=1)
    (grant,) = _claimed(agent)
    lifecycle.mark_failed(grant.job.id, actor="operator:olga")
    job = Job.objects.get(id=grant.job.id)
    assert job.status == states.FAILURE and timeline.derived_report(job) is None
    assert timeline.derived_report(JobFactory(job_agent=agent)) is None  # queued


def test_the_timeline_places_the_report_by_its_time():
    agent = JobAgentFactory()
    (grant,) = _claimed(agent)
    lifecycle.report_status(grant.job.id, grant.claim_id, states.SUCCESSFUL,
                            job_agent_id=agent.id)
    # A refused write after the report comes after it.
    with pytest.raises(JobFinished):
        lifecycle.heartbeat(grant.job.id, grant.claim_id, job_agent_id=agent.id)
    kinds = [e.kind for e in timeline_events(grant.job.id)]
    assert kinds == ["claimed", "status_reported", "stale_write_refused"]
    job = Job.objects.get(id=grant.job.id)
    assert [e.kind for e in timeline.events(job, 2)] == ["status_reported",
                                                        "stale_write_refused"]


@pytest.mark.postgres_only
def test_racing_requeues_of_a_finished_job_keep_its_report_once():
    agent = JobAgentFactory()
    (grant,) = _claimed(agent)
    lifecycle.report_status(grant.job.id, grant.claim_id, states.SUCCESSFUL,
                            job_agent_id=agent.id)

    def work(_i, barrier):
        barrier.wait()
        return lifecycle.requeue_job(grant.job.id, actor="operator:a").status

    statuses = run_threads(work, 4)
    assert statuses == [states.QUEUED] * 4
    assert len(_stored(grant.job.id)) == 1
    assert [e.kind for e in timeline_events(grant.job.id)].count("status_reported") == 1


@pytest.mark.postgres_only
def test_a_requeue_of_a_running_job_waits_for_an_effect_begin_without_a_deadlock():
    """keep_report locks the job row FOR NO KEY UPDATE, as the requeue's UPDATE does: FOR
    UPDATE would block the KEY SHARE lock of the effect row's foreign-key check at the
    begin's commit, while the requeue waits for the claim row the begin holds."""
    agent = JobAgentFactory()
    (grant,) = _claimed(agent)
    job_id = grant.job.id

    def work(i, barrier):
        if i == 0:
            with transaction.atomic():
                effects.begin_effect(job_id, grant.claim_id, "charge")
                barrier.wait()
                wait_for(lambda: _lock_waiters() > 0, 30, "the requeue to wait")
            return "begun"
        barrier.wait()
        return lifecycle.requeue_job(job_id, actor="operator:a").status

    assert run_threads(work, 2) == ["begun", states.QUEUED]


def _lock_waiters() -> int:
    """Sessions of the test database waiting for a lock, as they are now: inside a
    transaction pg_stat_activity answers the snapshot of its first read, so each look clears
    it (else a first look before the other thread waits sees no waiter, ever)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                       " AND wait_event_type = 'Lock'")
        return cursor.fetchone()[0]
