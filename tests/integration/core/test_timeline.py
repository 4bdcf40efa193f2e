"""jobqueue.timeline: which final reports are stored and which are read from the job row, on
the single and the batch path, the requeue that keeps one, and racing requeues."""

import pytest
from django.db import connection, transaction

from jobqueue import lifecycle, states, timeline
from jobqueue.db import NowPlusSeconds
from jobqueue.exceptions import JobFinished
from jobqueue.lifecycle import effects
from jobqueue.models import Job, JobClaim, JobEvent
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
    """keep_said locks the job row FOR NO KEY UPDATE, as the requeue's UPDATE does: FOR
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
    """The sessions of this database waiting on a lock now (inside a transaction, whose
    first read of pg_stat_activity is otherwise kept until it ends)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                       " AND wait_event_type = 'Lock'")
        return cursor.fetchone()[0]


# --- the latest claim's `claimed`, read from the job row ---------------------------------


def _stored_claimed(job_id):
    return list(JobEvent.objects.filter(job_id=job_id, kind=JobEvent.CLAIMED).order_by("id"))


def _claimed_view(e):
    return (e.attempt, e.claim_id, e.created_at, e.actor, e.holder, e.detail)


def test_a_claim_stores_no_claimed_event_and_the_row_says_it():
    agent = JobAgentFactory()
    job = JobFactory(job_agent=agent)
    grant = lifecycle.claim_job(agent, job.id, holder="host-a:41")
    assert not _stored_claimed(job.id)
    row = Job.objects.get(id=job.id)
    assert (row.claim_lease_seconds, row.claim_holder) == (agent.lease_seconds, "host-a:41")
    (derived,) = timeline_events(job.id, JobEvent.CLAIMED)
    assert derived.id is None
    assert _claimed_view(derived) == (1, grant.claim_id, row.started_at, f"agent:{agent.id}",
                                      "host-a:41", {"lease_seconds": agent.lease_seconds})
    # An empty holder takes no bytes in the row and reads back as "".
    other = JobFactory(job_agent=agent)
    lifecycle.claim_job(agent, other.id)
    assert Job.objects.get(id=other.id).claim_holder is None
    assert timeline_events(other.id, JobEvent.CLAIMED)[0].holder == ""


def test_the_next_claim_stores_the_claimed_event_of_the_claim_it_replaces():
    agent = JobAgentFactory(max_attempts=3)
    job = JobFactory(job_agent=agent)
    first = lifecycle.claim_job(agent, job.id, holder="host-a:1")
    before = Job.objects.get(id=job.id)
    (said_then,) = timeline_events(job.id, JobEvent.CLAIMED)
    lifecycle.report_status(job.id, first.claim_id, states.FAILURE, retry=True,
                            job_agent_id=agent.id)
    Job.objects.filter(id=job.id).update(available_at=before.started_at)  # no backoff wait
    (second,) = lifecycle.claim_next(agent, 5, holder="host-b:2")  # the batch statement
    (kept,) = _stored_claimed(job.id)
    assert _claimed_view(kept) == _claimed_view(said_then)
    assert kept.created_at == before.started_at
    kinds = [(e.kind, e.attempt) for e in timeline_events(job.id)]
    assert kinds[-3:] == [("claimed", 1), ("status_reported", 1), ("claimed", 2)]
    (now_said,) = [e for e in timeline_events(job.id, JobEvent.CLAIMED) if e.id is None]
    assert (now_said.claim_id, now_said.holder) == (second.claim_id, "host-b:2")
    # The attempts read both: the first ended retrying, the second runs.
    from jobqueue import history
    attempts = history.attempts(Job.objects.get(id=job.id))
    assert [(a.number, a.outcome, a.holder) for a in attempts] == [
        (1, "retrying", "host-a:1"), (2, None, "host-b:2")]


def test_a_reaped_claim_is_said_by_the_row_until_the_next_claim_by_id():
    agent = JobAgentFactory(max_attempts=3)
    job = JobFactory(job_agent=agent)
    lifecycle.claim_job(agent, job.id)
    JobClaim.objects.filter(job_id=job.id).update(claim_expires_at=NowPlusSeconds(-1))
    lifecycle.reap_expired_claims_once(batch_size=10)
    assert [e.kind for e in timeline_events(job.id)][-2:] == ["claimed", "reaped"]
    assert not _stored_claimed(job.id)
    lifecycle.claim_job(agent, job.id, expected_attempt=1)  # the named statement
    assert len(_stored_claimed(job.id)) == 1
    assert [(e.kind, e.attempt) for e in timeline_events(job.id)][-3:] == [
        ("claimed", 1), ("reaped", 1), ("claimed", 2)]


def test_operator_transitions_and_a_group_cancel_store_the_event_they_clear():
    agent = JobAgentFactory()
    running, requeued = JobFactory(job_agent=agent), JobFactory(job_agent=agent)
    grouped, _ = lifecycle.create_job(workspace=agent.workspace, job_agent=agent, group="g")
    for job in (running, requeued, grouped):
        lifecycle.claim_job(agent, job.id)
    lifecycle.cancel_job(running.id, actor="operator:olga")
    grant = JobClaim.objects.get(job_id=requeued.id)
    lifecycle.report_status(requeued.id, grant.claim_id, states.SUCCESSFUL,
                            job_agent_id=agent.id)
    lifecycle.requeue_job(requeued.id, actor="operator:olga")
    lifecycle.cancel_group(agent.workspace_id, "g", actor="operator:olga")
    for job in (running, requeued, grouped):
        assert len(_stored_claimed(job.id)) == 1, job
        assert Job.objects.get(id=job.id).last_claim_id is None
        assert [e.kind for e in timeline_events(job.id)].count("claimed") == 1
    assert [e.kind for e in timeline_events(requeued.id)][-3:] == [
        "claimed", "status_reported", "requeued"]


def test_a_claim_made_before_the_columns_is_never_doubled():
    """A job claimed before migration 0022 stored its event and has no claim columns: the
    row says nothing, and its next claim stores nothing for it."""
    agent = JobAgentFactory(max_attempts=3)
    job = JobFactory(job_agent=agent)
    grant = lifecycle.claim_job(agent, job.id)
    with transaction.atomic():
        timeline.keep_said(Job.objects.filter(id=job.id))  # as the claim before 0022 stored it
    Job.objects.filter(id=job.id).update(claim_lease_seconds=None, claim_holder=None)
    assert [e.kind for e in timeline_events(job.id)].count("claimed") == 1
    lifecycle.release_job(job.id, grant.claim_id, job_agent_id=agent.id)
    lifecycle.claim_job(agent, job.id)
    assert len(_stored_claimed(job.id)) == 1
    assert [e.kind for e in timeline_events(job.id)].count("claimed") == 2


@pytest.mark.postgres_only
def test_racing_cancels_of_a_running_job_keep_its_claimed_once():
    agent = JobAgentFactory()
    (grant,) = _claimed(agent)

    def work(_i, barrier):
        barrier.wait()
        return lifecycle.cancel_job(grant.job.id, actor="operator:a").status

    assert run_threads(work, 4) == [states.CANCELLED] * 4
    assert len(_stored_claimed(grant.job.id)) == 1
    assert [e.kind for e in timeline_events(grant.job.id)].count("claimed") == 1


def test_an_event_stored_between_a_readers_queries_is_never_shown_twice():
    """A reader that read what the row says before a claim stored it (the claim replacing
    that claim committed between its queries) shows it once: merged drops it."""
    agent = JobAgentFactory(max_attempts=3)
    job = JobFactory(job_agent=agent)
    grant = lifecycle.claim_job(agent, job.id)
    lifecycle.release_job(job.id, grant.claim_id, job_agent_id=agent.id)
    before = Job.objects.get(id=job.id)
    said_before = timeline.said(before)
    assert [e.kind for e in said_before] == ["claimed"]
    lifecycle.claim_job(agent, job.id)  # stores the first claim's event
    stored_after = list(JobEvent.objects.filter(job_id=job.id).order_by(*timeline.TIME_ORDER))
    shown = timeline.merged(stored_after, said_before)
    assert [(e.kind, e.attempt) for e in shown].count(("claimed", 1)) == 1
    # And a reader holding the old row reads nothing twice either.
    assert [(e.kind, e.attempt) for e in timeline.events(before, 100)].count(("claimed", 1)) == 1


def test_the_admin_reads_the_rows_claim_fields_in_one_query():
    """The admin's change form defers last_claim_id: its attempts and timeline reload the
    fields they read together, so an object read before a claim shows no mixed claim."""
    from django.contrib.admin.sites import site

    agent = JobAgentFactory(max_attempts=3)
    job = JobFactory(job_agent=agent)
    grant = lifecycle.claim_job(agent, job.id)
    lifecycle.release_job(job.id, grant.claim_id, job_agent_id=agent.id)
    admin = site._registry[Job]
    stale = Job.objects.defer("last_claim_id").get(id=job.id)  # as get_queryset loads it
    second = lifecycle.claim_job(agent, job.id, holder="host-b:2")
    html = admin.attempt_history(stale)
    assert html.count("host-b:2") == 1 and html.count("released") == 1
    assert str(second.claim_id) not in html
    from jobqueue import history
    assert [(a.number, a.outcome) for a in history.attempts(timeline.fresh(job.id))] == [
        (1, "released"), (2, None)]


def test_a_claim_whose_event_is_stored_already_is_not_stored_again():
    """A row that says a claim whose event is stored all the same (a claim by an older
    release, which stored it) makes the next claim store nothing more for it."""
    agent = JobAgentFactory(max_attempts=3)
    job = JobFactory(job_agent=agent)
    grant = lifecycle.claim_job(agent, job.id)
    lifecycle.release_job(job.id, grant.claim_id, job_agent_id=agent.id)
    with transaction.atomic():
        timeline.keep_said(Job.objects.filter(id=job.id))  # stored, the row still says it
    assert len(_stored_claimed(job.id)) == 1
    lifecycle.claim_next(agent, 1)
    assert len(_stored_claimed(job.id)) == 1
    assert [e.kind for e in timeline_events(job.id)].count("claimed") == 2


def test_an_ending_of_the_same_time_as_its_claim_closes_the_attempt():
    """SQLite keeps milliseconds: a claim and its release can share a time, and the claim
    read from the row then sorts after the stored release."""
    from jobqueue import history

    agent = JobAgentFactory(max_attempts=3)
    job = JobFactory(job_agent=agent)
    grant = lifecycle.claim_job(agent, job.id)
    lifecycle.release_job(job.id, grant.claim_id, job_agent_id=agent.id, reason="bye")
    started = Job.objects.get(id=job.id).started_at
    JobEvent.objects.filter(job_id=job.id, kind=JobEvent.RELEASED).update(created_at=started)
    assert [(a.number, a.outcome, a.message)
            for a in history.attempts(Job.objects.get(id=job.id))] == [(1, "released", "bye")]
