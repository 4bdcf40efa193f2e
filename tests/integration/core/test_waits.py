"""Long-poll in the core: held claims (claim_next_waiting) and producers' waits
(wait_for_job_end), woken by the transitions of this and other processes (jobqueue.wakeups).

Real threads, real processes, committed transactions (NOTIFY is delivered on commit). The
re-check is pushed out to a minute unless a test is about it, so a wake-up within the bounds
below can only come from the transition's own announcement."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection, connections

from jobqueue import lifecycle, states, wakeups
from jobqueue.db import NowPlusSeconds
from jobqueue.exceptions import InvalidInput, NotFound
from jobqueue.lifecycle import inputs
from jobqueue.models import Job, JobAgent, JobClaim
from tests.factories import JobAgentFactory, JobFactory, claimed_job
from tests.utils import run_threads, spawn

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("wakeups_stopped_after")]

WAKE_BOUND = 1.0  # seconds from a transition's commit to the waiter holding its claim


@pytest.fixture(autouse=True)
def slow_recheck(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "WAIT_RECHECK_SECONDS": 60.0}


@pytest.fixture
def pool():
    with ThreadPoolExecutor(max_workers=8) as executor:
        yield executor


def in_thread(pool, fn, *args, **kwargs):
    """fn in a pool thread (its own connection, closed after); a future of (result, when)."""

    def run():
        try:
            return fn(*args, **kwargs), time.monotonic()
        finally:
            connections.close_all()

    return pool.submit(run)


def until_waiting(n: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while wakeups.hub().waiting() < n:
        assert time.monotonic() < deadline, f"{wakeups.hub().waiting()} of {n} waiters"
        time.sleep(0.01)
    if connection.vendor == "postgresql":
        assert wakeups.hub().connected.wait(10), "the listener never connected"


def fresh(agent) -> JobAgent:
    return JobAgent.objects.select_related("workspace").get(id=agent.id)


def test_a_claimable_job_is_claimed_without_waiting():
    job = JobFactory()
    started = time.monotonic()
    grants = lifecycle.claim_next_waiting(fresh(job.job_agent), None, 30)
    assert [g.job.id for g in grants] == [job.id]
    assert time.monotonic() - started < 1


def test_an_empty_wait_answers_at_its_deadline_and_not_a_second_later():
    agent = JobAgentFactory()
    started = time.monotonic()
    assert lifecycle.claim_next_waiting(agent, None, 1) == []
    assert 1.0 <= time.monotonic() - started < 2.0
    assert lifecycle.claim_next_waiting(agent, 5, 1) == []  # a batch too
    assert wakeups.hub().waiting() == 0


def test_a_job_created_by_another_process_wakes_the_waiter(pool):
    agent = JobAgentFactory()
    waiter = in_thread(pool, lifecycle.claim_next_waiting, fresh(agent), None, 20)
    until_waiting(1)
    proc = spawn("-m", "tests.procs", "create_job", str(agent.id))
    out, err = proc.communicate(timeout=60)
    exited = time.monotonic()
    assert proc.returncode == 0, err
    grants, when = waiter.result(timeout=20)
    assert [str(g.job.id) for g in grants] == [out.strip()]
    assert when - exited < WAKE_BOUND


def _release(agent):
    job, grant = claimed_job(job_agent=agent)
    return job, lambda: lifecycle.release_job(job.id, grant.claim_id)


def _reap(agent):
    job, grant = claimed_job(job_agent=agent)
    JobClaim.objects.filter(job=job).update(claim_expires_at=NowPlusSeconds(-1))
    return job, lambda: lifecycle.reap_expired_claims_once(100)


def _requeue(agent):
    job, grant = claimed_job(job_agent=agent)
    lifecycle.report_status(job.id, grant.claim_id, states.FAILURE)
    return job, lambda: lifecycle.requeue_job(job.id)


def _dispatch(agent):
    job, _ = lifecycle.create_job(workspace=agent.workspace, job_agent=agent, hold=True)
    return job, lambda: lifecycle.dispatch_job(job.id)


def _parent_succeeds(agent, batch=False):
    """The child (this agent's) of a job of another agent, queued by its parent's success
    (lifecycle/dependencies.py)."""
    parent, grant = claimed_job(job_agent=JobAgentFactory(workspace=agent.workspace))
    job, _ = lifecycle.create_job(workspace=agent.workspace, job_agent=agent,
                                  depends_on=[parent.id])
    if batch:
        return job, lambda: lifecycle.report_many(parent.job_agent_id, [
            lifecycle.ReportItem(parent.id, grant.claim_id, states.SUCCESSFUL)])
    return job, lambda: lifecycle.report_status(parent.id, grant.claim_id, states.SUCCESSFUL)


def _parent_succeeds_in_a_batch(agent):
    return _parent_succeeds(agent, batch=True)


@pytest.mark.parametrize("transition", [_release, _reap, _requeue, _dispatch, _parent_succeeds,
                                        _parent_succeeds_in_a_batch])
def test_every_way_a_job_becomes_claimable_wakes_a_waiter(pool, transition):
    agent = fresh(JobAgentFactory())
    job, make_claimable = transition(agent)
    waiter = in_thread(pool, lifecycle.claim_next_waiting, fresh(agent), None, 20)
    until_waiting(1)
    time.sleep(0.1)  # the waiter's first claim found nothing and it sleeps
    make_claimable()
    done = time.monotonic()
    grants, when = waiter.result(timeout=20)
    assert [g.job.id for g in grants] == [job.id]
    assert when - done < WAKE_BOUND


def test_a_delayed_job_wakes_the_waiter_when_it_becomes_available(pool):
    agent = fresh(JobAgentFactory())
    waiter = in_thread(pool, lifecycle.claim_next_waiting, fresh(agent), None, 20)
    until_waiting(1)
    created = time.monotonic()
    job, _ = lifecycle.create_job(workspace=agent.workspace, job_agent=agent, delay_seconds=1)
    grants, when = waiter.result(timeout=20)
    assert [g.job.id for g in grants] == [job.id]
    assert 1.0 <= when - created < 1.0 + WAKE_BOUND


def test_a_release_with_retry_after_wakes_the_waiter_after_it(pool):
    agent = fresh(JobAgentFactory())
    job, grant = claimed_job(job_agent=agent)
    waiter = in_thread(pool, lifecycle.claim_next_waiting, fresh(agent), None, 20)
    until_waiting(1)
    released = time.monotonic()
    lifecycle.release_job(job.id, grant.claim_id, retry_after_seconds=1)
    grants, when = waiter.result(timeout=20)
    assert [g.job.id for g in grants] == [job.id]
    assert 1.0 <= when - released < 1.0 + WAKE_BOUND


@pytest.mark.parametrize("batch", [False, True])
def test_a_retryable_failure_wakes_the_waiter_when_its_backoff_ends(pool, batch):
    agent = fresh(JobAgentFactory())
    job, grant = claimed_job(job_agent=agent, max_attempts=2, retry_backoff_seconds=1)
    waiter = in_thread(pool, lifecycle.claim_next_waiting, fresh(agent), None, 20)
    until_waiting(1)
    reported = time.monotonic()
    if batch:
        lifecycle.report_many(agent.id, [lifecycle.ReportItem(job.id, grant.claim_id,
                                                              states.FAILURE, retry=True)])
    else:
        lifecycle.report_status(job.id, grant.claim_id, states.FAILURE, retry=True)
    grants, when = waiter.result(timeout=20)
    assert [(g.job.id, g.job.attempt) for g in grants] == [(job.id, 2)]
    assert 1.0 <= when - reported < 1.0 + WAKE_BOUND


def test_a_resume_wakes_every_held_claim_of_the_agent_at_once(pool):
    agent = fresh(JobAgentFactory())
    lifecycle.pause_job_agent(agent, "operator:test")
    jobs = {JobFactory(job_agent=agent).id for _ in range(3)}
    waiters = [in_thread(pool, lifecycle.claim_next_waiting, fresh(agent), None, 20)
               for _ in range(3)]
    until_waiting(3)
    time.sleep(0.3)
    assert not any(w.done() for w in waiters), "a paused agent's claims hand out nothing"
    lifecycle.resume_job_agent(agent, "operator:test")
    resumed = time.monotonic()
    got = [w.result(timeout=20) for w in waiters]
    assert {g.job.id for grants, _ in got for g in grants} == jobs  # one each
    assert max(when for _, when in got) - resumed < WAKE_BOUND


def test_the_recheck_leaves_a_paused_agents_waiters_asleep():
    hub = wakeups.Hub()
    hub._ensure_thread = lambda: None
    agent = fresh(JobAgentFactory())
    JobFactory(job_agent=agent)
    lifecycle.pause_job_agent(agent, "operator:test")
    waiter = hub.register(wakeups.agent_key(agent.id))
    hub.recheck()
    assert not waiter.event.is_set()  # it would claim nothing: no statement for it
    lifecycle.resume_job_agent(agent, "operator:test")
    hub.recheck()
    assert waiter.event.is_set()


def test_a_job_of_another_agent_does_not_end_the_wait(pool):
    agent, other = fresh(JobAgentFactory()), JobAgentFactory()
    waiter = in_thread(pool, lifecycle.claim_next_waiting, agent, None, 1)
    until_waiting(1)
    job, _ = lifecycle.create_job(workspace=other.workspace, job_agent=other)
    assert waiter.result(timeout=20)[0] == []
    assert Job.objects.get(id=job.id).status == states.QUEUED


def test_a_batch_waiter_claims_what_became_claimable(pool):
    agent = fresh(JobAgentFactory())
    waiter = in_thread(pool, lifecycle.claim_next_waiting, fresh(agent), 10, 20)
    until_waiting(1)
    job, _ = lifecycle.create_job(workspace=agent.workspace, job_agent=agent)
    grants, _ = waiter.result(timeout=20)
    assert [g.job.id for g in grants] == [job.id]


def test_the_recheck_finds_a_job_nobody_announced(pool, settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "WAIT_RECHECK_SECONDS": 0.2}
    agent = fresh(JobAgentFactory())
    waiter = in_thread(pool, lifecycle.claim_next_waiting, fresh(agent), None, 20)
    until_waiting(1)
    time.sleep(0.1)
    job = JobFactory(job_agent=agent)  # a plain INSERT: no NOTIFY, no wake file line
    inserted = time.monotonic()
    grants, when = waiter.result(timeout=20)
    assert [g.job.id for g in grants] == [job.id]
    assert when - inserted < 0.2 + WAKE_BOUND


def test_a_process_at_its_cap_answers_at_once(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "MAX_WAITING_CLAIMS": 0}
    agent = JobAgentFactory()
    started = time.monotonic()
    assert lifecycle.claim_next_waiting(agent, None, 20) == []
    assert time.monotonic() - started < 0.5


def _past_the_connect_wake_up() -> None:
    """Start the hub's thread and let its first wake-up pass (a listener that connects wakes
    every waiter), so that the wake-up the test sends is the only one its waiter sees: woken
    by the connect, a waiter that ends on its second check ended before until_waiting() saw
    it wait (CI, once, Python 3.12 on SQLite: "0 of 1 waiters")."""
    hub = wakeups.hub()
    if hub.connected.is_set():  # its thread runs already: that wake-up is long past
        return
    warm_up = hub.register("a:warm-up", capped=False)
    try:
        assert warm_up.event.wait(30), "the listener never started"
    finally:
        hub.unregister(warm_up)


def _connected_at_each_check(waits_warm, settings, pool):
    """Whether the thread's database connection was open when each of a held wait's checks
    began (the first check opens it; the one after the wake-up tells)."""
    settings.JOBQUEUE = {**settings.JOBQUEUE, "WARM_WAITS": waits_warm}
    seen = []

    def check():
        seen.append(connections["default"].connection is not None)
        list(Job.objects.filter(id=None))  # a query: the check's connection is open after
        return len(seen) >= 2

    _past_the_connect_wake_up()
    waiter = in_thread(pool, wakeups.wait_until, "a:checks", 20, check)
    until_waiting(1)
    wakeups.hub().wake("a:checks")
    assert waiter.result(timeout=20)[0] is True
    return seen


def test_a_held_wait_closes_its_connection_past_the_warm_ones(settings, pool):
    assert _connected_at_each_check(0, settings, pool)[1:] == [False]
    assert _connected_at_each_check(1, settings, pool)[1:] == [True]


@pytest.mark.postgres_only
def test_a_warm_waiter_whose_connection_died_while_it_waited_still_claims(settings, pool):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "WARM_WAITS": 1}
    agent = fresh(JobAgentFactory())
    waiter = in_thread(pool, lifecycle.claim_next_waiting, fresh(agent), None, 20)
    until_waiting(1)
    deadline = time.monotonic() + 10
    # The waiter's connection, idle since the wait's first check (a claim) ended: not the
    # listener's, nor the re-check's, nor one between preparing the claim and running it
    # (idle too for that moment, with the claim's text).
    while True:
        with connection.cursor() as c:
            c.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                "AND application_name <> %s AND state = 'idle' AND query LIKE %s "
                "AND state_change < clock_timestamp() - interval '200 milliseconds'",
                [wakeups.LISTENER_NAME, "%FOR NO KEY UPDATE SKIP LOCKED%"])
            if c.fetchall():
                break
        assert time.monotonic() < deadline, "the warm waiter held no connection to cut off"
        time.sleep(0.01)
    job, _ = lifecycle.create_job(workspace=agent.workspace, job_agent=agent)
    grants, _ = waiter.result(timeout=20)
    assert [g.job.id for g in grants] == [job.id]


def test_a_caller_that_left_claims_nothing(pool):
    agent = fresh(JobAgentFactory())
    left = threading.Event()
    waiter = in_thread(pool, lifecycle.claim_next_waiting, fresh(agent), None, 20,
                       gone=left.is_set)
    until_waiting(1)
    time.sleep(0.2)  # its first claim found nothing
    left.set()
    job, _ = lifecycle.create_job(workspace=agent.workspace, job_agent=agent)
    grants, _ = waiter.result(timeout=20)
    assert grants == []
    assert Job.objects.get(id=job.id).status == states.QUEUED
    # the wake-up it did not use went to the next waiter
    assert [g.job.id for g in lifecycle.claim_next_waiting(agent, None, 5)] == [job.id]


def test_a_closing_hub_ends_held_waits_and_holds_no_new_one(pool, monkeypatch):
    monkeypatch.setattr(wakeups, "_hub", wakeups.Hub())
    agent = fresh(JobAgentFactory())
    waiter = in_thread(pool, lifecycle.claim_next_waiting, fresh(agent), None, 20)
    until_waiting(1)
    closed = time.monotonic()
    wakeups.shutdown()
    grants, when = waiter.result(timeout=20)
    assert grants == [] and when - closed < WAKE_BOUND
    assert wakeups.hub().register(wakeups.agent_key(agent.id)) is None
    wakeups.hub().join()
    assert not wakeups.hub()._thread.is_alive()


def test_a_producer_wait_returns_on_the_terminal_transition(pool):
    job, grant = claimed_job()
    waiter = in_thread(pool, lifecycle.wait_for_job_end, job.id, 20,
                       workspace_id=job.workspace_id)
    until_waiting(1)
    time.sleep(0.1)
    lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL)
    reported = time.monotonic()
    _, when = waiter.result(timeout=20)
    assert when - reported < WAKE_BOUND


@pytest.mark.parametrize("end", ["cancel", "batch_report", "expire"])
def test_every_way_a_job_ends_ends_a_producer_wait(pool, end):
    agent = fresh(JobAgentFactory(max_attempts=1))
    job, grant = claimed_job(job_agent=agent)
    waiter = in_thread(pool, lifecycle.wait_for_job_end, job.id, 20)
    until_waiting(1)
    time.sleep(0.1)
    if end == "cancel":
        lifecycle.cancel_job(job.id)
    elif end == "batch_report":
        lifecycle.report_many(agent.id, [inputs.ReportItem(job.id, grant.claim_id,
                                                           states.FAILURE)])
    else:
        JobClaim.objects.filter(job=job).update(claim_expires_at=NowPlusSeconds(-1))
        lifecycle.reap_expired_claims_once(100)
    done = time.monotonic()
    _, when = waiter.result(timeout=20)
    assert when - done < WAKE_BOUND
    assert Job.objects.get(id=job.id).status in states.TERMINAL


def test_a_producer_wait_on_an_unfinished_job_ends_at_its_deadline():
    job = JobFactory()
    started = time.monotonic()
    assert lifecycle.wait_for_job_end(job.id, 1, workspace_id=job.workspace_id) is None
    assert 1.0 <= time.monotonic() - started < 2.0


def test_a_producer_wait_on_another_workspaces_job_is_not_found_at_once():
    job, other = JobFactory(), JobAgentFactory()
    started = time.monotonic()
    with pytest.raises(NotFound):
        lifecycle.wait_for_job_end(job.id, 20, workspace_id=other.workspace_id)
    assert time.monotonic() - started < 0.5


@pytest.mark.parametrize("value", [-1, 51, True, 1.5, "5"])
def test_wait_seconds_out_of_bounds_is_refused_before_anything(value):
    job = JobFactory()
    with pytest.raises(InvalidInput):
        lifecycle.claim_next_waiting(job.job_agent, None, value)
    with pytest.raises(InvalidInput):
        lifecycle.wait_for_job_end(job.id, value)
    assert Job.objects.get(id=job.id).status == states.QUEUED
    assert inputs.wait_seconds(None) == 0 and inputs.wait_seconds(50) == 50


def test_waiters_and_jobs_each_at_most_once():
    """N waiters of one agent and N new jobs: each waiter claims at most one job, each job
    is claimed once; all of them within the waits. PostgreSQL: 200 (SQLite: 20)."""
    n = 200 if connection.vendor == "postgresql" else 20
    agent = fresh(JobAgentFactory())

    def waiter(i, barrier):
        barrier.wait()
        time.sleep(i * 0.01)  # the first claims spread out: a few connections at a time
        return [g.job.id for g in lifecycle.claim_next_waiting(agent, None, 40)]

    def producer():
        until_waiting(n, timeout=30)
        made = [lifecycle.create_job(workspace=agent.workspace, job_agent=agent)[0].id
                for _ in range(n)]
        connections.close_all()
        return made

    with ThreadPoolExecutor(max_workers=1) as one:
        made = one.submit(producer)
        results = run_threads(waiter, n, timeout=120)
        made = made.result(timeout=60)
    claimed = [job_id for got in results for job_id in got]
    assert all(len(got) <= 1 for got in results)
    assert sorted(claimed) == sorted(made)  # each job once, none left
    assert JobClaim.objects.filter(job__job_agent=agent).count() == n


@pytest.mark.postgres_only
def test_the_listener_reconnects_and_waiters_still_wake(pool):
    agent = fresh(JobAgentFactory())
    hub = wakeups.hub()
    warm = hub.register("warm-up", capped=False)  # the thread runs
    try:
        assert hub.connected.wait(10)
        connects = hub.connects
        with connection.cursor() as c:
            c.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                      "WHERE application_name = %s AND datname = current_database()",
                      [wakeups.LISTENER_NAME])
            assert c.fetchall(), "no listener to cut off"
        deadline = time.monotonic() + 10
        while hub.connects == connects:  # it notices the loss and connects again
            assert time.monotonic() < deadline, "the listener did not reconnect"
            time.sleep(0.01)
    finally:
        hub.unregister(warm)
    waiter = in_thread(pool, lifecycle.claim_next_waiting, fresh(agent), None, 20)
    until_waiting(1)
    time.sleep(0.1)
    job, _ = lifecycle.create_job(workspace=agent.workspace, job_agent=agent)
    created = time.monotonic()
    grants, when = waiter.result(timeout=20)
    assert [g.job.id for g in grants] == [job.id] and when - created < WAKE_BOUND


@pytest.mark.postgres_only
def test_reports_notify_only_for_jobs_a_producer_waits_for():
    """Every NOTIFY serializes commits cluster-wide, so the report statements (single and
    batch) send one only for a job a producer's wait marked (job.watched)."""
    import psycopg

    agent = fresh(JobAgentFactory(max_attempts=1))
    (plain, g1), (watched, g2), (batched, g3) = (claimed_job(job_agent=agent)
                                                for _ in range(3))
    assert lifecycle.wait_for_job_end(watched.id, 0) is None  # no wait: no mark
    assert not Job.objects.filter(watched=True).exists()
    d = connection.settings_dict
    with psycopg.connect(host=d["HOST"] or "127.0.0.1", port=d["PORT"] or 5432,
                         user=d["USER"] or "postgres", dbname=d["NAME"],
                         autocommit=True) as listener:
        listener.execute(f"LISTEN {wakeups.CHANNEL}")
        assert lifecycle.wait_for_job_end(watched.id, 1) is None  # marks it, then times out
        Job.objects.filter(id=batched.id).update(watched=True)
        lifecycle.report_status(plain.id, g1.claim_id, states.SUCCESSFUL)
        lifecycle.report_status(watched.id, g2.claim_id, states.SUCCESSFUL)
        lifecycle.report_many(agent.id, [inputs.ReportItem(batched.id, g3.claim_id,
                                                           states.FAILURE)])
        got = [n.payload for n in listener.notifies(timeout=1.0)]
    assert sorted(got) == sorted([wakeups.job_key(watched.id), wakeups.job_key(batched.id)])
    assert set(Job.objects.filter(watched=True).values_list("id", flat=True)) == {
        watched.id, batched.id}
