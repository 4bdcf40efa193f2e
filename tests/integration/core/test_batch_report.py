"""lifecycle.report_many: the agent-level batch report (a batch acknowledgement), on both
backends, and racing real callers (threads with their own connections) on PostgreSQL."""

import dataclasses
import random
import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobqueue import lifecycle, states
from jobqueue.db import NowPlusSeconds, db_now
from jobqueue.exceptions import Conflict, InvalidInput
from jobqueue.models import Job, JobClaim, JobEvent
from tests.factories import JobAgentFactory, JobFactory, WorkspaceFactory
from tests.utils import events_of_kind, final_state_is_consistent, run_threads, timeline_events

pytestmark = pytest.mark.django_db(transaction=True)


def claim_many(agent, n):
    JobFactory.create_batch(n, job_agent=agent)
    grants = lifecycle.claim_next_jobs(agent, n)
    assert len(grants) == n
    return grants


def report(grant, status=states.SUCCESSFUL, **extra):
    return lifecycle.ReportItem(grant.job.id, grant.claim_id, status, **extra)


def snapshot(ids):
    return {
        row["id"]: row
        for row in Job.objects.filter(id__in=ids).values(
            "id", "status", "updated_at", "attempt", "last_claim_id", "message", "result",
            "external_id", "completed_at",
        )
    }


def events(kind, ids=None):
    """The events of `kind` on the jobs' timelines (an agent's final report is read from
    the job row: jobqueue/timeline.py), by time."""
    found = events_of_kind(kind, **({} if ids is None else {"id__in": ids}))
    return sorted(found, key=lambda e: (e.created_at, str(e.job_id)))


def test_ends_every_current_claim_at_once_and_keeps_order():
    agent = JobAgentFactory()
    grants = claim_many(agent, 4)
    JobClaim.objects.filter(job_id=grants[0].job.id).update(claim_expires_at=NowPlusSeconds(-5))
    request = [
        report(grants[3], states.FAILURE, message="boom", result={"exit": 3}),
        report(grants[1], states.SUCCESSFUL, external_id="ext-1"),
        report(grants[0], states.SUCCESSFUL),  # lease expired, not reaped: still accepted
        report(grants[2], states.CANCELLED, message=""),
    ]
    t0 = db_now()
    out = lifecycle.report_many(agent.id, request)
    t1 = db_now()
    assert [r.job_id for r in out.results] == [r.job_id for r in request]
    assert all(r.accepted and r.code is None for r in out.results)
    assert not JobClaim.objects.exists()
    for item, outcome in zip(request, out.results, strict=True):
        stored = Job.objects.get(id=item.job_id)
        assert stored.status == item.status
        assert t0 <= stored.completed_at <= t1
        assert outcome.status == stored.status
        assert outcome.completed_at == stored.completed_at
        assert stored.last_claim_id == item.claim_id
    failed = Job.objects.get(id=grants[3].job.id)
    assert (failed.message, failed.result) == ("boom", {"exit": 3})
    assert Job.objects.get(id=grants[1].job.id).external_id == "ext-1"
    untouched = Job.objects.get(id=grants[0].job.id)
    assert (untouched.message, untouched.result, untouched.external_id) == ("", None, "")
    reported = events(JobEvent.STATUS_REPORTED)
    assert sorted((e.job_id, e.claim_id, e.detail["status"], e.detail["has_result"],
                   e.actor) for e in reported) == sorted(
        (r.job_id, r.claim_id, r.status, r.result is not None, f"agent:{agent.id}")
        for r in request
    )
    assert not events(JobEvent.STALE_WRITE_REFUSED)


def test_each_refusal_has_its_code_and_changes_nothing():
    ws = WorkspaceFactory()
    agent = JobAgentFactory(workspace=ws, max_attempts=5)
    other = JobAgentFactory(workspace=ws)
    live, released, cancelled, finished, requeued, reaped, retried = claim_many(agent, 7)
    (foreign,) = claim_many(other, 1)

    lifecycle.release_job(released.job.id, released.claim_id)
    reclaimed = lifecycle.claim_job(agent, released.job.id)
    lifecycle.cancel_job(cancelled.job.id)
    lifecycle.report_status(finished.job.id, finished.claim_id, states.FAILURE)
    lifecycle.requeue_job(requeued.job.id)
    JobClaim.objects.filter(job_id=reaped.job.id).update(claim_expires_at=NowPlusSeconds(-1))
    assert lifecycle.reap_expired_claims_once(10).requeued == 1
    lifecycle.report_status(retried.job.id, retried.claim_id, states.SUCCESSFUL, message="m")
    unknown = uuid.uuid4()

    request = [
        report(live),
        report(released),
        report(cancelled),
        report(finished),  # ended as failure already: a different final report
        report(requeued),
        report(reaped),
        report(retried, message="m"),  # the same final report again: a lost response
        lifecycle.ReportItem(unknown, uuid.uuid4(), states.SUCCESSFUL),
        report(foreign),
    ]
    ids = [r.job_id for r in request]
    before = snapshot(ids)
    claims_before = set(JobClaim.objects.values_list("job_id", "claim_id"))
    reported_before = len(events(JobEvent.STATUS_REPORTED))
    out = lifecycle.report_many(agent.id, request)

    assert [(r.job_id, r.accepted, r.code) for r in out.results] == [
        (live.job.id, True, None),
        (released.job.id, False, "claim_superseded"),
        (cancelled.job.id, False, "job_cancelled"),
        (finished.job.id, False, "job_finished"),
        (requeued.job.id, False, "claim_superseded"),
        (reaped.job.id, False, "claim_superseded"),
        (retried.job.id, True, None),
        (unknown, False, "not_found"),
        (foreign.job.id, False, "not_found"),  # another agent's job: not even its status
    ]
    assert out.results[6].status == states.SUCCESSFUL
    assert out.results[6].completed_at == Job.objects.get(id=retried.job.id).completed_at
    after = snapshot(ids)
    for job_id in ids[1:]:
        assert after.get(job_id) == before.get(job_id)
    assert after[live.job.id]["status"] == states.SUCCESSFUL
    assert set(JobClaim.objects.values_list("job_id", "claim_id")) == claims_before - {
        (live.job.id, live.claim_id)
    }
    assert (reclaimed.job.id, reclaimed.claim_id) in claims_before
    # One new report event (the live job's); the retry adds none.
    assert len(events(JobEvent.STATUS_REPORTED)) == reported_before + 1
    refused = events(JobEvent.STALE_WRITE_REFUSED)
    assert sorted((e.job_id, e.detail["code"], e.detail["operation"]) for e in refused) == sorted(
        [
            (released.job.id, "claim_superseded", "status"),
            (cancelled.job.id, "job_cancelled", "status"),
            (finished.job.id, "job_finished", "status"),
            (requeued.job.id, "claim_superseded", "status"),
            (reaped.job.id, "claim_superseded", "status"),
        ]
    )


def test_same_answers_as_the_single_report():
    agent = JobAgentFactory()
    a, b, c, d = claim_many(agent, 4)
    lifecycle.cancel_job(a.job.id)
    lifecycle.report_status(b.job.id, b.claim_id, states.FAILURE)
    lifecycle.requeue_job(c.job.id)
    lifecycle.report_status(d.job.id, d.claim_id, states.SUCCESSFUL)
    batch = lifecycle.report_many(agent.id, [report(g) for g in (a, b, c, d)])
    for grant, outcome in zip([a, b, c], batch.results[:3], strict=True):
        with pytest.raises(Conflict) as err:
            lifecycle.report_status(grant.job.id, grant.claim_id, states.SUCCESSFUL,
                                    job_agent_id=agent.id)
        assert err.value.code == outcome.code
    single = lifecycle.report_status(d.job.id, d.claim_id, states.SUCCESSFUL,
                                     job_agent_id=agent.id)
    assert batch.results[3].accepted
    assert (batch.results[3].status, batch.results[3].completed_at) == (single.status,
                                                                        single.completed_at)


def test_workspace_scope():
    agent = JobAgentFactory()
    (grant,) = claim_many(agent, 1)
    out = lifecycle.report_many(agent.id, [report(grant)], workspace_id=WorkspaceFactory().id)
    assert out.results[0].code == "not_found"
    assert Job.objects.get(id=grant.job.id).status == states.IN_PROGRESS
    out = lifecycle.report_many(agent.id, [report(grant)], workspace_id=agent.workspace_id)
    assert out.results[0].accepted


@pytest.mark.parametrize(
    "bad",
    [
        [],
        "not a list",
        [lifecycle.ReportItem(uuid.uuid4(), uuid.uuid4(), "in_progress")],
        [lifecycle.ReportItem(uuid.uuid4(), uuid.uuid4(), "expired")],
        "DUPLICATE",
        "TOO_MANY",
    ],
)
def test_bad_input_is_refused_whole_and_changes_nothing(bad, settings):
    """The batch's rules (inputs.report_batch). Malformed items (not an object, not a UUID,
    not text, a NUL, too long) never reach the lifecycle: the edge refuses them
    (tests/integration/api/test_batch_endpoints.py)."""
    settings.JOBQUEUE = {"MAX_REPORT_BATCH": 3}
    agent = JobAgentFactory()
    grants = claim_many(agent, 2)
    good = [report(g) for g in grants]
    if bad == "DUPLICATE":
        bad = [good[0], good[1], good[0]]
    elif bad == "TOO_MANY":
        bad = good + [dataclasses.replace(report(grants[0]), job_id=uuid.uuid4())
                      for _ in range(2)]
    elif isinstance(bad, list) and bad:
        bad = good[:1] + bad
    before = snapshot([g.job.id for g in grants])
    with pytest.raises(InvalidInput) as err:
        lifecycle.report_many(agent.id, bad)
    assert err.value.code == "validation_error"
    assert snapshot([g.job.id for g in grants]) == before
    assert JobClaim.objects.count() == 2
    assert not events(JobEvent.STATUS_REPORTED)


@pytest.mark.postgres_only
def test_a_batch_is_one_statement_on_postgres():
    agent = JobAgentFactory()
    grants = claim_many(agent, 10)
    with CaptureQueriesContext(connection) as ctx:
        out = lifecycle.report_many(agent.id, [report(g) for g in grants])
    assert all(r.accepted for r in out.results)
    assert len(ctx.captured_queries) == 1


# --- races ----------------------------------------------------------------------------------


@pytest.mark.postgres_only
def test_race_batch_reports_against_each_other_reapers_cancels_and_heartbeats():
    """Two batch reporters (opposite orders, different statuses) race a reaper, a batch
    heartbeat and an operator cancelling a third of the jobs, while a third of the leases
    expire. Nothing deadlocks; every job ends exactly once; each accepted report is the one
    recorded; invariant 2 holds."""
    agent = JobAgentFactory(lease_seconds=5, max_attempts=1)
    grants = claim_many(agent, 60)
    by_job = {g.job.id: g for g in grants}
    JobClaim.objects.filter(job_id__in=[g.job.id for g in grants[::3]]).update(
        claim_expires_at=NowPlusSeconds(-1)
    )
    to_cancel = [g.job.id for g in grants[1::3]]
    statuses = [states.SUCCESSFUL, states.FAILURE]

    def work(i, barrier):
        barrier.wait()
        if i < 2:
            order = grants if i == 0 else list(reversed(grants))
            outs = []
            for start in range(0, len(order), 7):
                chunk = order[start:start + 7]
                outs.append(lifecycle.report_many(agent.id, [report(g, statuses[i])
                                                             for g in chunk]))
            return outs
        if i == 2:
            for _ in range(10):
                lifecycle.reap_expired_claims_once(5)
        elif i == 3:
            for _ in range(10):
                lifecycle.heartbeat_many(agent.id, [(g.job.id, g.claim_id) for g in
                                                    random.sample(grants, len(grants))])
        else:
            for job_id in to_cancel:
                try:
                    lifecycle.cancel_job(job_id)
                except Conflict:
                    pass
        return None

    results = run_threads(work, 5)
    lifecycle.reap_expired_claims_once(1000)
    final_state_is_consistent()
    winners = {}
    for i, outs in enumerate(results[:2]):
        for out in outs:
            for r in out.results:
                if r.accepted:
                    assert r.status == statuses[i]
                    assert winners.setdefault(r.job_id, statuses[i]) == statuses[i]
                else:
                    assert r.code in {"job_finished", "job_cancelled", "claim_superseded"}
    for job in Job.objects.filter(id__in=list(by_job)):
        assert job.status in states.TERMINAL  # max_attempts=1: a reaped job is expired
        ends = [e for e in timeline_events(job.id)
                if e.kind in (JobEvent.STATUS_REPORTED, JobEvent.REAPED, JobEvent.EXPIRED,
                              JobEvent.CANCELLED)]
        assert len(ends) == 1, (job.status, [e.kind for e in ends])
        if job.id in winners:
            assert job.status == winners[job.id]
            assert ends[0].kind == JobEvent.STATUS_REPORTED
        else:
            assert job.status in (states.CANCELLED, states.EXPIRED)


def test_race_batch_reports_across_threads_on_either_backend():
    """Threads report overlapping sets with the same status (on SQLite, writers queue):
    every job is reported once; the others get the retry answer (accepted, no new event)."""
    agent = JobAgentFactory()
    grants = claim_many(agent, 12)

    def work(i, barrier):
        barrier.wait()
        return lifecycle.report_many(agent.id, [report(g) for g in random.sample(grants, 8)])

    for out in run_threads(work, 3):
        assert all(r.accepted and r.status == states.SUCCESSFUL for r in out.results)
    assert set(Job.objects.values_list("status", flat=True)) <= {states.SUCCESSFUL,
                                                                states.IN_PROGRESS}
    reported = [e.job_id for e in events(JobEvent.STATUS_REPORTED)]
    assert len(reported) == len(set(reported))
    final_state_is_consistent()
