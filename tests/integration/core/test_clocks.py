"""The three clocks (docs/clocks.md): max_runtime_seconds (per attempt, from its claim,
heartbeats or not) and expires_at (the whole job), beside the lease; enforced by the reaper,
by the claim (never an overdue job) and by every holder's write (409 deadline_exceeded).
Boundaries just before and after each deadline, on both backends; racing callers on
PostgreSQL."""

import datetime as dt

import pytest
from django.db.models import F

from jobqueue import lifecycle, states
from jobqueue.db import NowPlusSeconds, db_now
from jobqueue.exceptions import (
    DeadlineExceeded,
    IdempotencyKeyReused,
    InvalidInput,
    JobNotClaimable,
)
from jobqueue.maintenance import reaper
from jobqueue.models import Job, JobClaim, JobEvent
from tests.factories import JobAgentFactory
from tests.utils import final_state_is_consistent, run_threads

pytestmark = pytest.mark.django_db(transaction=True)


def new_job(agent=None, **fields):
    agent = agent or JobAgentFactory(lease_seconds=60)
    job, _ = lifecycle.create_job(workspace=agent.workspace, job_agent=agent, **fields)
    return job


def claimed(**fields):
    job = new_job(**fields)
    grant = lifecycle.claim_job(job.job_agent, job.id)
    return grant.job, grant


def age(job, seconds):
    """Move the running attempt `seconds` into the past (its claim, start, deadline and
    lease), as if that much time had gone by on the database's clock."""
    delta = dt.timedelta(seconds=seconds)
    Job.objects.filter(id=job.id).update(started_at=F("started_at") - delta)
    JobClaim.objects.filter(job_id=job.id).update(
        claimed_at=F("claimed_at") - delta, deadline_at=F("deadline_at") - delta,
        claim_expires_at=F("claim_expires_at") - delta)


def kinds(job):
    return list(JobEvent.objects.filter(job=job).order_by("id").values_list("kind", flat=True))


def last_event(job):
    return JobEvent.objects.filter(job=job).order_by("-id").first()


# --- create -----------------------------------------------------------------------------


def test_clock_fields_on_create_and_the_agents_default():
    agent = JobAgentFactory(max_runtime_seconds=120)
    job = new_job(agent)
    assert job.max_runtime_seconds == 120 and job.expires_at is None
    soon = db_now() + dt.timedelta(hours=1)
    own = new_job(agent, max_runtime_seconds=5, expires_at=soon)
    assert own.max_runtime_seconds == 5 and own.expires_at == soon
    assert new_job().max_runtime_seconds is None


@pytest.mark.parametrize(("field", "value"), [
    ("max_runtime_seconds", 0), ("max_runtime_seconds", 7 * 86400 + 1),
    ("max_runtime_seconds", True), ("expires_at", "2030-01-01T00:00:00Z"),
    ("expires_at", dt.datetime(2030, 1, 1)),  # no time zone
])
def test_clock_fields_are_bounded(field, value):
    with pytest.raises(InvalidInput) as err:
        new_job(**{field: value})
    assert err.value.context["field"] == field
    assert not Job.objects.exists()


@pytest.mark.parametrize("seconds", [-1, 0, 10**8 + 5])
def test_expires_at_must_be_ahead_by_the_database_clock(seconds):
    with pytest.raises(InvalidInput) as err:
        new_job(expires_at=db_now() + dt.timedelta(seconds=seconds))
    assert err.value.context["field"] == "expires_at"


def test_an_idempotent_replay_with_clocks_returns_the_first_job():
    agent = JobAgentFactory()
    soon = db_now() + dt.timedelta(seconds=30)
    body = {"max_runtime_seconds": 9, "expires_at": soon, "retry_backoff_seconds": 2}
    first = new_job(agent, idempotency_key="k-1", **body)
    Job.objects.filter(id=first.id).update(expires_at=NowPlusSeconds(-1))  # time went by
    replay, created = lifecycle.create_job(workspace=agent.workspace, job_agent=agent,
                                           idempotency_key="k-1", **{**body})
    assert not created and replay.id == first.id
    with pytest.raises(IdempotencyKeyReused):
        new_job(agent, idempotency_key="k-1", **{**body, "max_runtime_seconds": 10})
    # A key used before the clocks existed still matches a request without them.
    plain = new_job(agent, idempotency_key="k-2")
    again, created = lifecycle.create_job(workspace=agent.workspace, job_agent=agent,
                                          idempotency_key="k-2")
    assert not created and again.id == plain.id


def test_agent_max_runtime_is_bounded():
    agent = JobAgentFactory()
    with pytest.raises(InvalidInput):
        lifecycle.create_job_agent(workspace=agent.workspace, name="x", max_runtime_seconds=0)
    made = lifecycle.create_job_agent(workspace=agent.workspace, name="y", max_runtime_seconds=9)
    assert made.max_runtime_seconds == 9


# --- max_runtime_seconds ------------------------------------------------------------------------


def test_claim_caps_the_lease_at_the_runtime_deadline():
    job, grant = claimed(max_runtime_seconds=10)
    claim = JobClaim.objects.get(job=job)
    assert claim.deadline_at == claim.claimed_at + dt.timedelta(seconds=10)
    assert claim.claim_expires_at == claim.deadline_at == grant.claim_expires_at
    # Without a clock: the lease as before, no deadline.
    job2, grant2 = claimed()
    claim2 = JobClaim.objects.get(job=job2)
    assert claim2.deadline_at is None
    assert claim2.claim_expires_at == claim2.claimed_at + dt.timedelta(seconds=60)
    assert grant2.claim_expires_at == claim2.claim_expires_at


def test_heartbeats_never_extend_the_lease_past_the_deadline():
    job, grant = claimed(max_runtime_seconds=100)
    first = lifecycle.heartbeat(job.id, grant.claim_id)
    assert first.claim_expires_at == first.server_time + dt.timedelta(seconds=60)
    age(job, 95)  # 5 s left: the lease may not run 60 s more
    JobClaim.objects.filter(job=job).update(claim_expires_at=NowPlusSeconds(3))  # still live
    deadline = JobClaim.objects.get(job=job).deadline_at
    out = lifecycle.heartbeat(job.id, grant.claim_id)
    assert out.claim_expires_at == deadline
    many = lifecycle.heartbeat_many(job.job_agent_id, [(job.id, grant.claim_id)])
    assert many.results[0].renewed and many.results[0].claim_expires_at == deadline


def test_just_before_the_runtime_deadline_every_write_is_taken():
    job, grant = claimed(max_runtime_seconds=30)
    age(job, 28)
    lifecycle.heartbeat(job.id, grant.claim_id)
    lifecycle.report_status(job.id, grant.claim_id, states.IN_PROGRESS, message="half")
    out = lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL)
    assert out.status == states.SUCCESSFUL


@pytest.mark.parametrize("write", ["heartbeat", "progress", "report", "release", "batch_hb",
                                   "batch_report"])
def test_just_after_the_runtime_deadline_the_holder_gets_deadline_exceeded(write):
    job, grant = claimed(max_runtime_seconds=30)
    age(job, 30.5)
    before = Job.objects.filter(id=job.id).values().get()
    agent_id = job.job_agent_id
    if write.startswith("batch"):
        if write == "batch_hb":
            out = lifecycle.heartbeat_many(agent_id, [(job.id, grant.claim_id)]).results[0]
        else:
            out = lifecycle.report_many(agent_id, [lifecycle.ReportItem(
                job.id, grant.claim_id, states.SUCCESSFUL)]).results[0]
        assert out.code == "deadline_exceeded"
    else:
        call = {
            "heartbeat": lambda: lifecycle.heartbeat(job.id, grant.claim_id),
            "progress": lambda: lifecycle.report_status(job.id, grant.claim_id,
                                                        states.IN_PROGRESS, message="x"),
            "report": lambda: lifecycle.report_status(job.id, grant.claim_id, states.FAILURE,
                                                      retry=True),
            "release": lambda: lifecycle.release_job(job.id, grant.claim_id),
        }[write]
        with pytest.raises(DeadlineExceeded):
            call()
    assert Job.objects.filter(id=job.id).values().get() == before
    assert last_event(job).detail["code"] == "deadline_exceeded"


def test_reaper_ends_an_overrun_attempt_then_the_holder_is_told_why():
    job, grant = claimed(max_runtime_seconds=30, max_attempts=2)
    age(job, 10)
    assert lifecycle.reap_expired_claims_once(10).reaped == 0  # before the deadline
    age(job, 21)
    assert lifecycle.count_expired_claims() == {"would_requeue": 1, "would_expire": 0}
    assert lifecycle.reap_expired_claims_once(10).requeued == 1
    job.refresh_from_db()
    assert job.status == states.QUEUED and job.attempt == 1
    timed_out = last_event(job)
    assert timed_out.kind == JobEvent.TIMED_OUT and timed_out.claim_id == grant.claim_id
    assert timed_out.detail == {"clock": "max_runtime", "requeued": True}
    for call in (lambda: lifecycle.heartbeat(job.id, grant.claim_id),
                 lambda: lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL),
                 lambda: lifecycle.release_job(job.id, grant.claim_id)):
        with pytest.raises(DeadlineExceeded):
            call()
    # The next attempt has its own clock; on the last one the job ends expired.
    second = lifecycle.claim_job(job.job_agent, job.id)
    assert second.attempt == 2
    age(job, 31)
    assert lifecycle.reap_expired_claims_once(10).expired == 1
    job.refresh_from_db()
    assert job.status == states.EXPIRED and "max_runtime_seconds" in job.message
    assert last_event(job).detail == {"clock": "max_runtime", "requeued": False}
    with pytest.raises(DeadlineExceeded):  # not job_finished: a clock ended its attempt
        lifecycle.report_status(job.id, second.claim_id, states.SUCCESSFUL)
    final_state_is_consistent()


def test_a_lease_lost_before_the_deadline_is_reaped_as_before():
    job, grant = claimed(max_runtime_seconds=600)
    JobClaim.objects.filter(job=job).update(claim_expires_at=NowPlusSeconds(-1))
    assert lifecycle.reap_expired_claims_once(10).requeued == 1
    assert kinds(job)[-1] == JobEvent.REAPED and last_event(job).detail == {}
    with pytest.raises(Exception) as err:
        lifecycle.heartbeat(job.id, grant.claim_id)
    assert err.value.code == "claim_superseded"


# --- expires_at -----------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["pending", "queued", "delayed"])
def test_a_waiting_job_past_expires_at_is_never_claimed_and_ends_expired(how):
    job = new_job(hold=how == "pending", delay_seconds=3600 if how == "delayed" else None,
                  expires_at=db_now() + dt.timedelta(seconds=30))
    assert lifecycle.expire_overdue_jobs_once(10).expired == 0  # just before
    Job.objects.filter(id=job.id).update(expires_at=NowPlusSeconds(-1),
                                         available_at=NowPlusSeconds(-5))
    if how == "pending":
        lifecycle.dispatch_job(job.id)  # dispatched after its deadline: still never claimed
    # Before the reaper runs, no claim serves it.
    assert lifecycle.claim_next_job(job.job_agent) is None
    with pytest.raises(JobNotClaimable):
        lifecycle.claim_job(job.job_agent, job.id)
    assert lifecycle.count_expired_claims()["would_expire"] == 1
    result = reaper.sweep(batch_size=10)
    assert result.expired == 1 and result.requeued == 0
    job.refresh_from_db()
    assert job.status == states.EXPIRED and job.completed_at is not None
    assert job.message == "expires_at passed before the job ran."
    assert kinds(job)[-1] == JobEvent.DEADLINE_PASSED
    assert last_event(job).detail == {"clock": "expires_at"}
    assert reaper.sweep(batch_size=10).expired == 0


def test_the_deadline_passed_event_of_a_job_queued_for_a_retry_names_its_attempt():
    # As every other event of the job does: attempt 1 ran, failed retryably, and the job
    # waited for attempt 2 when its expires_at passed.
    job, grant = claimed(expires_at=db_now() + dt.timedelta(seconds=60), max_attempts=3)
    lifecycle.report_status(job.id, grant.claim_id, states.FAILURE, retry=True)
    Job.objects.filter(id=job.id).update(expires_at=NowPlusSeconds(-1))
    assert reaper.sweep(batch_size=10).expired == 1
    job.refresh_from_db()
    assert job.status == states.EXPIRED and job.attempt == 1
    passed = last_event(job)
    assert (passed.kind, passed.attempt) == (JobEvent.DEADLINE_PASSED, 1)


def test_a_job_with_expires_at_ahead_is_claimed_with_the_lease_capped():
    job = new_job(expires_at=db_now() + dt.timedelta(seconds=20))
    grant = lifecycle.claim_next_job(job.job_agent)
    assert grant.job.id == job.id
    claim = JobClaim.objects.get(job=job)
    assert claim.deadline_at == job.expires_at == claim.claim_expires_at
    assert grant.claim_expires_at == job.expires_at


def test_a_running_job_past_expires_at_ends_expired_whatever_its_attempts():
    job, grant = claimed(expires_at=db_now() + dt.timedelta(seconds=20), max_attempts=5,
                         max_runtime_seconds=600)
    Job.objects.filter(id=job.id).update(expires_at=NowPlusSeconds(-1))
    JobClaim.objects.filter(job=job).update(deadline_at=NowPlusSeconds(-1),
                                            claim_expires_at=NowPlusSeconds(-1))
    with pytest.raises(DeadlineExceeded):
        lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL)
    assert lifecycle.reap_expired_claims_once(10).expired == 1
    job.refresh_from_db()
    assert job.status == states.EXPIRED and job.message == (
        "expires_at passed while the job was running.")
    assert last_event(job).detail == {"clock": "expires_at", "requeued": False}
    with pytest.raises(DeadlineExceeded):
        lifecycle.heartbeat(job.id, grant.claim_id)
    final_state_is_consistent()


def test_sweep_takes_each_clock_in_bounded_batches():
    agent = JobAgentFactory()
    overdue = [new_job(agent, expires_at=db_now() + dt.timedelta(seconds=30)) for _ in range(5)]
    Job.objects.filter(id__in=[j.id for j in overdue]).update(expires_at=NowPlusSeconds(-1))
    running = []
    for _ in range(3):
        job = new_job(agent, max_runtime_seconds=10)
        lifecycle.claim_job(agent, job.id)
        age(job, 11)
        running.append(job)
    result = reaper.sweep(batch_size=2)
    assert (result.requeued, result.expired) == (3, 5)
    assert result.batches == 5  # 2 + 1 claims, 2 + 2 + 1 overdue
    assert reaper.sweep(batch_size=2, max_batches=1).batches == 0


# --- races (real threads, each with its own connection; SQLite serializes the writers) -------


def claimed_on(agent, **fields):
    job = new_job(agent, **fields)
    return job, lifecycle.claim_job(agent, job.id)


def _reap_for(seconds):
    def reap():
        import time

        end = time.monotonic() + seconds
        n = 0
        while time.monotonic() < end:
            n += lifecycle.reap_expired_claims_once(50).reaped
        return n
    return reap


@pytest.mark.parametrize("rival", ["report", "cancel", "heartbeat"])
def test_runtime_end_racing_a_holder_or_an_operator_exactly_one_wins(rival):
    n = 20
    agent = JobAgentFactory(lease_seconds=60, max_attempts=3)
    jobs = []
    for i in range(n):
        job, grant = claimed_on(agent, max_runtime_seconds=30)
        age(job, 29.8 + 0.4 * i / n)
        jobs.append((job, grant))

    def act(i, barrier):
        barrier.wait()
        if i == 0:
            return _reap_for(1.0)()
        out = {}
        for job, grant in jobs:
            try:
                if rival == "report":
                    lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL)
                elif rival == "cancel":
                    lifecycle.cancel_job(job.id)
                else:
                    hb = lifecycle.heartbeat(job.id, grant.claim_id)
                    deadline = JobClaim.objects.filter(job=job).values_list(
                        "deadline_at", flat=True).first()
                    assert deadline is None or hb.claim_expires_at <= deadline
                out[job.id] = "ok"
            except Exception as exc:  # noqa: BLE001 - the code is what is checked
                out[job.id] = getattr(exc, "code", repr(exc))
        return out

    reaped, answers = run_threads(act, 2)
    timed_out = 0
    for job, _grant in jobs:
        job.refresh_from_db()
        k = kinds(job)
        if JobEvent.TIMED_OUT in k:
            timed_out += 1
            assert k.count(JobEvent.TIMED_OUT) == 1
        if rival == "report":
            assert (answers[job.id] == "ok") == (job.status == states.SUCCESSFUL)
            assert (job.status == states.SUCCESSFUL) != (JobEvent.TIMED_OUT in k)
            if answers[job.id] != "ok":
                assert answers[job.id] in ("deadline_exceeded",)
        elif rival == "cancel":
            assert job.status == states.CANCELLED  # cancel works on any status here
            assert answers[job.id] == "ok"
        else:
            assert answers[job.id] in ("ok", "deadline_exceeded")
            assert job.status in (states.IN_PROGRESS, states.QUEUED)
            assert (job.status == states.QUEUED) == (JobEvent.TIMED_OUT in k)
    assert reaped == timed_out
    final_state_is_consistent()


@pytest.mark.postgres_only
def test_concurrent_reapers_end_each_overrun_attempt_exactly_once():
    agent = JobAgentFactory(lease_seconds=60, max_attempts=1)
    jobs = []
    for i in range(60):
        job, grant = claimed_on(agent, max_runtime_seconds=30)
        age(job, 31 if i % 2 else 61)  # half: the lease ran out at the same moment too
        if i % 2 == 0:
            JobClaim.objects.filter(job=job).update(claim_expires_at=NowPlusSeconds(-2))
        jobs.append(job)
    overdue = [new_job(agent, expires_at=db_now() + dt.timedelta(seconds=30)) for _ in range(40)]
    Job.objects.filter(id__in=[j.id for j in overdue]).update(expires_at=NowPlusSeconds(-1))

    def sweep(i, barrier):
        barrier.wait()
        return reaper.sweep(batch_size=7, record=False).expired

    assert sum(run_threads(sweep, 4)) == 100
    ended = JobEvent.objects.filter(kind__in=[JobEvent.TIMED_OUT, JobEvent.DEADLINE_PASSED,
                                              JobEvent.EXPIRED, JobEvent.REAPED])
    assert ended.count() == 100
    assert Job.objects.filter(status=states.EXPIRED).count() == 100
    final_state_is_consistent()
