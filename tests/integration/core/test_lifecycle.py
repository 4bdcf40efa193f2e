"""Every transition, its guards and its refusals, on whichever backend this pass runs."""

import uuid
from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.models import F
from django.db.models.functions import Now

from jobqueue import lifecycle, states
from jobqueue.db import NowPlusSeconds, db_now
from jobqueue.exceptions import (
    ClaimSuperseded,
    IdempotencyKeyReused,
    InvalidInput,
    InvalidTransition,
    JobCancelled,
    JobFinished,
    JobNotClaimable,
    LeaseExpired,
    NotFound,
)
from jobqueue.models import Job, JobAgent, JobClaim, JobEvent
from tests.factories import JobAgentFactory, JobFactory, WorkspaceFactory, claimed_job
from tests.utils import timeline_events

pytestmark = pytest.mark.django_db(transaction=True)


def kinds(job):
    """The job's timeline as readers see it: stored events and those the row says."""
    return [e.kind for e in timeline_events(job.id)]


def expire_claim(job, seconds_ago=1):
    JobClaim.objects.filter(job=job).update(claim_expires_at=NowPlusSeconds(-seconds_ago))


# --- create, dispatch ----------------------------------------------------------------------


def test_create_job_defaults_from_agent_and_records_event():
    agent = JobAgentFactory(max_attempts=5)
    job, created = lifecycle.create_job(
        workspace=agent.workspace, job_agent=agent, dispatch_context={"k": "v"}, actor="producer"
    )
    assert created and job.status == states.QUEUED
    assert job.max_attempts == job.initial_max_attempts == 5
    assert job.attempt == 0 and job.completed_at is None
    assert kinds(job) == [JobEvent.CREATED]
    assert "v" not in str(JobEvent.objects.get(job=job).detail)


def test_create_rejects_agent_of_another_workspace():
    agent = JobAgentFactory()
    with pytest.raises(NotFound):
        lifecycle.create_job(workspace=WorkspaceFactory(), job_agent=agent)
    assert Job.objects.count() == 0


@pytest.mark.parametrize("bad", [0, -1, 101, "3", True])
def test_create_rejects_max_attempts_out_of_bounds(bad):
    agent = JobAgentFactory()
    with pytest.raises(InvalidInput):
        lifecycle.create_job(workspace=agent.workspace, job_agent=agent, max_attempts=bad)
    assert Job.objects.count() == 0


def test_idempotency_key_replay_and_reuse():
    agent = JobAgentFactory()
    kw = dict(workspace=agent.workspace, job_agent=agent, dispatch_context={"a": 1})
    first, created = lifecycle.create_job(idempotency_key="k1", **kw)
    again, created_again = lifecycle.create_job(idempotency_key="k1", **kw)
    assert created and not created_again and again.id == first.id
    with pytest.raises(IdempotencyKeyReused):
        lifecycle.create_job(
            idempotency_key="k1", workspace=agent.workspace, job_agent=agent,
            dispatch_context={"a": 2},
        )
    # Keys are unique per workspace, not globally.
    other_agent = JobAgentFactory()
    other, created_other = lifecycle.create_job(
        idempotency_key="k1", workspace=other_agent.workspace, job_agent=other_agent
    )
    assert created_other and other.id != first.id
    assert Job.objects.count() == 2


def test_idempotency_key_unique_in_database():
    job = JobFactory(idempotency_key="dup")
    with pytest.raises(IntegrityError), transaction.atomic():
        JobFactory(job_agent=job.job_agent, idempotency_key="dup")


def test_held_job_is_pending_until_dispatched():
    agent = JobAgentFactory()
    job, _ = lifecycle.create_job(workspace=agent.workspace, job_agent=agent, hold=True)
    assert job.status == states.PENDING
    assert lifecycle.claim_next_job(agent) is None
    with pytest.raises(JobNotClaimable):
        lifecycle.claim_job(agent, job.id)
    with pytest.raises(InvalidTransition):
        lifecycle.requeue_job(job.id)
    dispatched = lifecycle.dispatch_job(job.id, actor="producer")
    assert dispatched.status == states.QUEUED
    with pytest.raises(InvalidTransition):
        lifecycle.dispatch_job(job.id)
    assert lifecycle.claim_next_job(agent).job.id == job.id


def test_delayed_job_not_claimable_until_due():
    agent = JobAgentFactory()
    job, _ = lifecycle.create_job(workspace=agent.workspace, job_agent=agent, delay_seconds=3600)
    assert job.available_at > db_now() + timedelta(seconds=3500)
    assert lifecycle.claim_next_job(agent) is None
    Job.objects.filter(id=job.id).update(available_at=NowPlusSeconds(-1))
    assert lifecycle.claim_next_job(agent).job.id == job.id


def test_completed_at_check_constraint():
    job = JobFactory()
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.filter(id=job.id).update(status=states.SUCCESSFUL)
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.filter(id=job.id).update(completed_at=Now())
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.filter(id=job.id).update(status="bogus")


def test_one_claim_per_job_by_primary_key():
    job, grant = claimed_job()
    with pytest.raises(IntegrityError), transaction.atomic():
        JobClaim.objects.create(
            job=job, job_agent=job.job_agent, attempt=2, lease_seconds=60,
            claim_expires_at=grant.claim_expires_at,
        )


# --- claim -------------------------------------------------------------------------------


def test_claim_named_job_returns_lease_from_database_clock():
    agent = JobAgentFactory(lease_seconds=45)
    job = JobFactory(job_agent=agent, dispatch_context={"token": "x"})
    before = db_now()
    grant = lifecycle.claim_job(agent, job.id)
    after = db_now()
    assert grant.job.dispatch_context == {"token": "x"}
    assert grant.attempt == 1 and grant.lease_seconds == 45
    assert grant.heartbeat_interval_seconds == 15
    assert before <= grant.claimed_at <= after
    assert grant.claim_expires_at == grant.claimed_at + timedelta(seconds=45)
    row = Job.objects.get(id=job.id)
    claim = JobClaim.objects.get(job=job)
    assert row.status == states.IN_PROGRESS and row.attempt == 1
    assert claim.claim_id == grant.claim_id == row.last_claim_id
    assert claim.claim_expires_at == grant.claim_expires_at
    assert kinds(job) == [JobEvent.CLAIMED]


def test_claim_named_job_refusals():
    agent = JobAgentFactory()
    job = JobFactory(job_agent=agent)
    lifecycle.claim_job(agent, job.id)
    with pytest.raises(JobNotClaimable):
        lifecycle.claim_job(agent, job.id)
    other_agent = JobAgentFactory(workspace=agent.workspace)
    with pytest.raises(NotFound):
        lifecycle.claim_job(other_agent, JobFactory(job_agent=agent).id)
    with pytest.raises(NotFound):
        lifecycle.claim_job(agent, uuid.uuid4())
    # A malformed job id never reaches the lifecycle: the URL's is a 404 at the edge
    # (tests/integration/api/test_errors.py).
    assert JobClaim.objects.count() == 1


def test_claim_next_follows_priority_then_available_at_then_created_at():
    agent = JobAgentFactory()
    low_old = JobFactory(job_agent=agent, priority=0)
    high = JobFactory(job_agent=agent, priority=5)
    low_new = JobFactory(job_agent=agent, priority=0)
    Job.objects.filter(id=low_old.id).update(available_at=NowPlusSeconds(-60))
    JobFactory(priority=100)  # another agent's job is never handed out
    order = [lifecycle.claim_next_job(agent).job.id for _ in range(3)]
    assert order == [high.id, low_old.id, low_new.id]
    assert lifecycle.claim_next_job(agent) is None


def test_claim_next_batch_claims_each_job_once():
    agent = JobAgentFactory()
    jobs = {JobFactory(job_agent=agent).id for _ in range(5)}
    grants = lifecycle.claim_next_jobs(agent, limit=3)
    rest = lifecycle.claim_next_jobs(agent, limit=3)
    assert len(grants) == 3 and len(rest) == 2
    assert {g.job.id for g in grants + rest} == jobs
    assert len({g.claim_id for g in grants + rest}) == 5
    assert JobClaim.objects.count() == 5
    with pytest.raises(InvalidInput):
        lifecycle.claim_next_jobs(agent, limit=0)


def test_lease_seconds_clamped_to_bounds(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "MAX_LEASE_SECONDS": 30}
    agent = JobAgentFactory(lease_seconds=999)
    job = JobFactory(job_agent=agent)
    assert lifecycle.claim_job(agent, job.id).lease_seconds == 30


# --- heartbeat -----------------------------------------------------------------------------


def test_heartbeat_extends_from_database_now():
    job, grant = claimed_job()
    JobClaim.objects.filter(job=job).update(claim_expires_at=NowPlusSeconds(5))
    result = lifecycle.heartbeat(job.id, grant.claim_id)
    assert result.claim_expires_at == result.server_time + timedelta(seconds=60)
    claim = JobClaim.objects.get(job=job)
    assert claim.claim_expires_at == result.claim_expires_at
    assert claim.heartbeat_at is not None


def test_heartbeat_after_expiry_is_refused_and_lease_stays_expired():
    job, grant = claimed_job()
    expire_claim(job)
    expired_at = JobClaim.objects.get(job=job).claim_expires_at
    with pytest.raises(LeaseExpired):
        lifecycle.heartbeat(job.id, grant.claim_id)
    claim = JobClaim.objects.get(job=job)
    assert claim.claim_expires_at == expired_at < db_now()
    assert Job.objects.get(id=job.id).status == states.IN_PROGRESS
    assert kinds(job)[-1] == JobEvent.STALE_WRITE_REFUSED
    # ...and the reaper still takes it.
    assert lifecycle.reap_expired_claims_once(10).requeued == 1


def test_heartbeat_scoped_to_agent_and_validated():
    job, grant = claimed_job()
    with pytest.raises(NotFound):
        lifecycle.heartbeat(job.id, grant.claim_id, job_agent_id=JobAgentFactory().id)
    with pytest.raises(NotFound):
        lifecycle.heartbeat(uuid.uuid4(), grant.claim_id)
    with pytest.raises(ClaimSuperseded):
        lifecycle.heartbeat(job.id, uuid.uuid4())
    assert lifecycle.heartbeat(job.id, grant.claim_id, job_agent_id=job.job_agent_id)


# --- report, release ---------------------------------------------------------------------


def test_progress_report_keeps_status_and_does_not_extend_lease():
    job, grant = claimed_job()
    before = JobClaim.objects.get(job=job).claim_expires_at
    out = lifecycle.report_status(
        job.id, grant.claim_id, states.IN_PROGRESS, message="half", result={"p": 50}
    )
    assert out.status == states.IN_PROGRESS and out.message == "half" and out.result == {"p": 50}
    assert JobClaim.objects.get(job=job).claim_expires_at == before


@pytest.mark.parametrize("status", [states.SUCCESSFUL, states.FAILURE, states.CANCELLED])
def test_terminal_report_removes_claim_and_retry_succeeds(status):
    job, grant = claimed_job()
    out = lifecycle.report_status(
        job.id, grant.claim_id, status, message="done", result={"n": 1}, external_id="ext-1"
    )
    assert out.status == status and out.completed_at is not None
    assert out.result == {"n": 1} and out.external_id == "ext-1"
    assert not JobClaim.objects.filter(job=job).exists()
    events = JobEvent.objects.count()
    again = lifecycle.report_status(job.id, grant.claim_id, status)
    assert again.id == job.id and again.status == status and again.completed_at == out.completed_at
    assert JobEvent.objects.count() == events  # a retry changes nothing
    other = states.FAILURE if status != states.FAILURE else states.SUCCESSFUL
    with pytest.raises(JobCancelled if status == states.CANCELLED else JobFinished):
        lifecycle.report_status(job.id, grant.claim_id, other)
    assert Job.objects.get(id=job.id).status == status


def test_terminal_report_accepted_after_expiry_until_reaped():
    job, grant = claimed_job()
    expire_claim(job)
    out = lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL)
    assert out.status == states.SUCCESSFUL
    assert lifecycle.reap_expired_claims_once(10).reaped == 0


def test_report_validation_changes_nothing():
    job, grant = claimed_job()
    with pytest.raises(InvalidInput):
        lifecycle.report_status(job.id, grant.claim_id, "done")
    # A missing or malformed claim_id is the edge's to refuse (400, test_errors.py).
    with pytest.raises(InvalidInput):
        lifecycle.report_status(job.id, grant.claim_id, states.EXPIRED)
    assert Job.objects.get(id=job.id).status == states.IN_PROGRESS
    assert JobClaim.objects.filter(job=job).exists()


def test_release_returns_to_queue_with_delay_and_attempt_kept():
    job, grant = claimed_job()
    out = lifecycle.release_job(job.id, grant.claim_id, reason="busy", retry_after_seconds=120)
    assert out.status == states.QUEUED and out.attempt == 1
    assert out.available_at > db_now() + timedelta(seconds=100)
    assert not JobClaim.objects.filter(job=job).exists()
    assert lifecycle.claim_next_job(job.job_agent) is None
    with pytest.raises(ClaimSuperseded):
        lifecycle.release_job(job.id, grant.claim_id)
    with pytest.raises(InvalidInput):
        lifecycle.release_job(job.id, grant.claim_id, retry_after_seconds=-1)
    Job.objects.filter(id=job.id).update(available_at=Now())
    regrant = lifecycle.claim_next_job(job.job_agent)
    assert regrant.attempt == 2 and regrant.claim_id != grant.claim_id


# --- operator transitions ------------------------------------------------------------------


def test_cancel_supersedes_claim_and_is_idempotent():
    job, grant = claimed_job()
    out = lifecycle.cancel_job(job.id, actor="operator:alice", reason="not needed")
    assert out.status == states.CANCELLED and out.completed_at is not None
    assert not JobClaim.objects.filter(job=job).exists()
    assert lifecycle.cancel_job(job.id).status == states.CANCELLED
    for call in (
        lambda: lifecycle.heartbeat(job.id, grant.claim_id),
        lambda: lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL),
        lambda: lifecycle.release_job(job.id, grant.claim_id),
    ):
        with pytest.raises(JobCancelled):
            call()
    ev = JobEvent.objects.get(job=job, kind=JobEvent.CANCELLED)
    assert ev.actor == "operator:alice" and ev.detail["superseded_claim"] is True


def test_cancel_finished_job_refused():
    job, grant = claimed_job()
    lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL)
    with pytest.raises(JobFinished):
        lifecycle.cancel_job(job.id)
    assert Job.objects.get(id=job.id).status == states.SUCCESSFUL


def test_requeue_grants_initial_attempts_again():
    agent = JobAgentFactory(max_attempts=2)
    job = JobFactory(job_agent=agent)
    for _ in range(2):
        lifecycle.claim_job(agent, job.id)
        expire_claim(job)
        lifecycle.reap_expired_claims_once(10)
    job.refresh_from_db()
    assert job.status == states.EXPIRED and job.attempt == 2
    out = lifecycle.requeue_job(job.id, actor="operator:bob")
    assert out.status == states.QUEUED and out.completed_at is None
    assert out.max_attempts == 4 and out.attempt == 2
    assert lifecycle.claim_job(agent, job.id).attempt == 3


@pytest.mark.parametrize(
    "operator_action,status,error",
    [
        (lifecycle.cancel_job, states.CANCELLED, JobCancelled),
        (lifecycle.mark_failed, states.FAILURE, JobFinished),
    ],
)
def test_superseded_holder_reporting_the_same_terminal_status_is_refused(
    operator_action, status, error
):
    """Not mistaken for a retry of its own report: the operator ended the job, not it."""
    job, grant = claimed_job()
    ended = operator_action(job.id, actor="operator:dan")
    with pytest.raises(error):
        lifecycle.report_status(job.id, grant.claim_id, status, message="mine", result={"x": 1})
    row = Job.objects.get(id=job.id)
    assert (row.message, row.result, row.updated_at) == (ended.message, None, ended.updated_at)
    assert kinds(job)[-1] == JobEvent.STALE_WRITE_REFUSED
    ended_event = JobEvent.objects.filter(job=job).exclude(
        kind=JobEvent.STALE_WRITE_REFUSED).last()
    assert ended_event.claim_id == grant.claim_id  # the timeline names the superseded claim


def test_mark_failed():
    job, grant = claimed_job()
    out = lifecycle.mark_failed(job.id, actor="operator:carol", reason="poison")
    assert out.status == states.FAILURE and out.message == "poison"
    assert not JobClaim.objects.filter(job=job).exists()
    with pytest.raises(JobFinished):
        lifecycle.mark_failed(job.id)


def test_workspace_scope_hides_other_workspaces_jobs():
    job, grant = claimed_job()
    other = WorkspaceFactory()
    for call in (
        lambda: lifecycle.cancel_job(job.id, workspace_id=other.id),
        lambda: lifecycle.requeue_job(job.id, workspace_id=other.id),
        lambda: lifecycle.report_status(
            job.id, grant.claim_id, states.SUCCESSFUL, workspace_id=other.id
        ),
        lambda: lifecycle.heartbeat(job.id, grant.claim_id, workspace_id=other.id),
    ):
        with pytest.raises(NotFound):
            call()
    assert Job.objects.get(id=job.id).status == states.IN_PROGRESS


# --- stale tokens after reap, requeue, cancel ------------------------------------------------


@pytest.mark.parametrize("supersede", ["reap", "requeue", "cancel", "release_reclaim"])
def test_old_claim_id_refused_everywhere_and_new_holder_unaffected(supersede):
    agent = JobAgentFactory(max_attempts=5)
    job = JobFactory(job_agent=agent)
    old = lifecycle.claim_job(agent, job.id)
    if supersede == "reap":
        expire_claim(job)
        assert lifecycle.reap_expired_claims_once(10).requeued == 1
    elif supersede == "requeue":
        lifecycle.requeue_job(job.id, actor="operator:x")
    elif supersede == "cancel":
        lifecycle.cancel_job(job.id, actor="operator:x")
    else:
        lifecycle.release_job(job.id, old.claim_id)
    new = None if supersede == "cancel" else lifecycle.claim_job(agent, job.id)
    snapshot = Job.objects.filter(id=job.id).values().get()
    claim_snapshot = list(JobClaim.objects.filter(job=job).values())
    expected = JobCancelled if supersede == "cancel" else ClaimSuperseded
    for call in (
        lambda: lifecycle.heartbeat(job.id, old.claim_id),
        lambda: lifecycle.report_status(job.id, old.claim_id, states.SUCCESSFUL),
        lambda: lifecycle.report_status(job.id, old.claim_id, states.IN_PROGRESS, message="x"),
        lambda: lifecycle.release_job(job.id, old.claim_id),
    ):
        with pytest.raises(expected):
            call()
    assert Job.objects.filter(id=job.id).values().get() == snapshot
    assert list(JobClaim.objects.filter(job=job).values()) == claim_snapshot
    refused = JobEvent.objects.filter(job=job, kind=JobEvent.STALE_WRITE_REFUSED)
    # One event per operation and code: the two status reports share one, counted twice.
    assert sorted((e.detail["operation"], e.count) for e in refused) == [
        ("heartbeat", 1), ("release", 1), ("status", 2)]
    assert {e.claim_id for e in refused} == {old.claim_id}
    if new is not None:
        assert new.attempt == 2
        lifecycle.heartbeat(job.id, new.claim_id)
        done = lifecycle.report_status(job.id, new.claim_id, states.SUCCESSFUL, result={"w": 2})
        assert done.result == {"w": 2} and done.attempt == 2


# --- reaper ------------------------------------------------------------------------------


def test_reaper_boundaries_expiry_and_attempts():
    agent = JobAgentFactory(max_attempts=3)
    past_retry, past_last, future = (JobFactory(job_agent=agent) for _ in range(3))
    for job in (past_retry, past_last, future):
        lifecycle.claim_job(agent, job.id)
    # attempt = max_attempts - 1 vs max_attempts.
    Job.objects.filter(id=past_retry.id).update(attempt=2)
    Job.objects.filter(id=past_last.id).update(attempt=3)
    # Just before now vs just after now (by the database's clock).
    JobClaim.objects.filter(job_id__in=[past_retry.id, past_last.id]).update(
        claim_expires_at=NowPlusSeconds(-0.05)
    )
    JobClaim.objects.filter(job=future).update(claim_expires_at=NowPlusSeconds(2))
    result = lifecycle.reap_expired_claims_once(100)
    assert (result.requeued, result.expired) == (1, 1)
    assert Job.objects.get(id=past_retry.id).status == states.QUEUED
    last = Job.objects.get(id=past_last.id)
    assert last.status == states.EXPIRED and last.completed_at is not None
    assert Job.objects.get(id=future.id).status == states.IN_PROGRESS
    assert list(JobClaim.objects.values_list("job_id", flat=True)) == [future.id]
    assert kinds(past_retry)[-1] == JobEvent.REAPED and kinds(past_last)[-1] == JobEvent.EXPIRED
    assert Job.objects.get(id=past_retry.id).attempt == 2  # reaping never changes attempt


def test_reaper_batches_and_sweep_records_run():
    from jobqueue.maintenance import reaper
    from jobqueue.models import ReaperRun

    agent = JobAgentFactory()
    jobs = [JobFactory(job_agent=agent) for _ in range(7)]
    lifecycle.claim_next_jobs(agent, limit=7)
    JobClaim.objects.update(claim_expires_at=NowPlusSeconds(-1))
    dry = reaper.sweep(batch_size=3, dry_run=True)
    assert (dry.requeued, dry.expired) == (7, 0)
    assert JobClaim.objects.count() == 7
    limited = reaper.sweep(batch_size=3, max_batches=2)
    assert limited.batches == 2 and limited.requeued == 6
    rest = reaper.sweep(batch_size=3)
    assert rest.requeued == 1
    assert Job.objects.filter(id__in=[j.id for j in jobs], status=states.QUEUED).count() == 7
    runs = ReaperRun.objects.order_by("id")
    assert [r.requeued for r in runs] == [0, 6, 1] and runs[0].dry_run
    assert all(r.finished_at >= r.started_at for r in runs)


def test_in_progress_iff_one_claim_after_every_transition():
    agent = JobAgentFactory(max_attempts=10)
    job = JobFactory(job_agent=agent)

    def check():
        row = Job.objects.get(id=job.id)
        has_claim = JobClaim.objects.filter(job=job).exists()
        assert (row.status == states.IN_PROGRESS) == has_claim, row.status

    g = lifecycle.claim_job(agent, job.id)
    check()
    lifecycle.release_job(job.id, g.claim_id)
    check()
    g = lifecycle.claim_job(agent, job.id)
    lifecycle.requeue_job(job.id)
    check()
    g = lifecycle.claim_job(agent, job.id)
    expire_claim(job)
    lifecycle.reap_expired_claims_once(10)
    check()
    g = lifecycle.claim_job(agent, job.id)
    lifecycle.report_status(job.id, g.claim_id, states.FAILURE)
    check()
    lifecycle.requeue_job(job.id)
    check()
    assert Job.objects.filter(id=job.id).values_list("attempt", flat=True).get() == 4
    assert Job.objects.filter(attempt__gt=F("max_attempts")).count() == 0


def test_backend_is_configured_for_several_processes():
    if connection.vendor == "postgresql":
        # Connections are reused and health-checked, so a restarted server costs no worker.
        assert connection.settings_dict["CONN_HEALTH_CHECKS"] is True
        return
    with connection.cursor() as cur:
        cur.execute("PRAGMA journal_mode")
        assert cur.fetchone()[0].lower() == "wal"
        cur.execute("PRAGMA busy_timeout")
        assert cur.fetchone()[0] >= 1000
    assert connection.transaction_mode == "IMMEDIATE"


@pytest.mark.parametrize("idempotency_key", [None, "k-1"])
def test_a_create_for_an_agent_deleted_meanwhile_fails_and_is_no_replay(idempotency_key):
    """The insert's IntegrityError is not taken for an idempotent replay when there is no
    key, nor when the key names no job: it propagates, and nothing is left behind."""
    agent = JobAgentFactory()
    workspace = agent.workspace
    JobAgent.objects.filter(id=agent.id).delete()
    with pytest.raises(IntegrityError):
        lifecycle.create_job(workspace=workspace, job_agent=agent,
                             idempotency_key=idempotency_key)
    assert not Job.objects.filter(workspace=workspace).exists()
