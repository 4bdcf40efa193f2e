"""Rate limits (#29 item 3) in the core: a key's permits go to its jobs in claim order, a
claim never takes a held job, the window is the database's, permits given where they may
free (cancel, delete, a limit set or removed, a pause) and when the window opens, racing
claims never pass the limit (PostgreSQL), and a job with a concurrency key and a rate limit
key waits for both without a deadlock."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

from jobqueue import claimrule, lifecycle, states
from jobqueue.lifecycle import ratelimits
from jobqueue.models import Job
from tests.factories import JobAgentFactory, JobFactory

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("wakeups_stopped_after")]


def _jobs(agent, key="api", n=1, **extra):
    return [JobFactory(job_agent=agent, rate_limit_key=key, **extra) for _ in range(n)]


def _held(jobs):
    return {j.id: Job.objects.get(id=j.id).rate_held for j in jobs}


def _claim(agent, limit=1, **kw):
    return lifecycle.claim_next(agent, limit=limit, **kw)


def _done(agent, grants):
    for g in grants:
        lifecycle.report_status(g.job.id, g.claim_id, states.SUCCESSFUL, job_agent_id=agent.id)


def test_a_key_without_a_limit_limits_nothing():
    agent = JobAgentFactory()
    jobs = _jobs(agent, n=3)
    assert set(_held(jobs).values()) == {None}
    assert len(_claim(agent, 10)) == 3


def test_a_plain_job_pays_nothing_and_is_never_held():
    agent = JobAgentFactory()
    ratelimits.set_limit(agent.workspace_id, "api", 1, 3600)
    plain = JobFactory(job_agent=agent)
    assert Job.objects.values("rate_limit_key", "rate_held").get(id=plain.id) == {
        "rate_limit_key": None, "rate_held": None}


def test_a_limit_gives_its_count_of_permits_in_claim_order():
    agent = JobAgentFactory()
    ratelimits.set_limit(agent.workspace_id, "api", 2, 3600)
    first = _jobs(agent, priority=5)[0]
    rest = _jobs(agent, n=3)
    held = _held([first, *rest])
    assert held[first.id] is None and held[rest[0].id] is None
    assert [held[j.id] for j in rest[1:]] == [True, True]
    got = _claim(agent, 10)
    assert {g.job.id for g in got} == {first.id, rest[0].id}
    _done(agent, got)  # finished, but claimed in the window: still counted
    assert _claim(agent, 10) == []
    assert claimrule.unmet(rest[1].id) == ["rate_permit"]


def test_a_named_claim_of_a_held_job_is_409_job_not_claimable():
    from jobqueue.exceptions import JobNotClaimable

    agent = JobAgentFactory()
    ratelimits.set_limit(agent.workspace_id, "api", 1, 3600)
    first, second = _jobs(agent, n=2)
    with pytest.raises(JobNotClaimable):
        lifecycle.claim_job(agent, second.id)
    assert lifecycle.claim_job(agent, first.id).job.id == first.id


def test_a_held_job_never_holds_back_other_keys_or_plain_jobs():
    agent = JobAgentFactory()
    ratelimits.set_limit(agent.workspace_id, "busy", 1, 3600)
    _jobs(agent, "busy", 5, priority=9)
    other = _jobs(agent, "other")[0]
    plain = JobFactory(job_agent=agent)
    got = {g.job.id for g in _claim(agent, 10)}
    assert other.id in got and plain.id in got and len(got) == 3


def test_keys_and_limits_belong_to_one_workspace():
    a, b = JobAgentFactory(), JobAgentFactory()
    ratelimits.set_limit(a.workspace_id, "shared", 1, 3600)
    _jobs(a, "shared", 2)
    _jobs(b, "shared", 2)
    assert len(_claim(a, 5)) == 1 and len(_claim(b, 5)) == 2


@pytest.mark.parametrize("path", ["cancel", "delete"])
def test_a_permit_a_queued_job_gave_up_goes_to_the_next(path):
    agent = JobAgentFactory()
    ratelimits.set_limit(agent.workspace_id, "api", 1, 3600)
    first, second = _jobs(agent, n=2)
    assert _held([first, second]) == {first.id: None, second.id: True}
    if path == "cancel":
        lifecycle.cancel_job(first.id, actor="test")
    else:
        Job.objects.filter(id=first.id).delete()
    assert [g.job.id for g in _claim(agent)] == [second.id]


def test_a_requeued_job_counts_once_and_waits_for_the_window():
    """A job claimed in the window and put back in the queue (a reap, a release, a requeue)
    is held back: its claim still fills the window, and it counts once."""
    agent = JobAgentFactory()
    ratelimits.set_limit(agent.workspace_id, "api", 1, 3600)
    first, second = _jobs(agent, n=2)
    (grant,) = _claim(agent)
    lifecycle.requeue_job(grant.job.id, actor="test")
    assert _held([first, second]) == {first.id: True, second.id: True}
    assert _claim(agent, 5) == []


def test_setting_removing_and_raising_a_limit_gives_permits_out():
    agent = JobAgentFactory()
    ws = agent.workspace_id
    ratelimits.set_limit(ws, "api", 1, 3600)
    jobs = _jobs(agent, n=4)
    assert list(_held(jobs).values()) == [None, True, True, True]
    ratelimits.set_limit(ws, "api", 3, 3600)  # raised: two more
    assert list(_held(jobs).values()) == [None, None, None, True]
    ratelimits.set_limit(ws, "api", 1, 3600)  # lowered: the queued jobs' permits dealt again
    assert list(_held(jobs).values()) == [None, True, True, True]
    assert len(_claim(agent, 10)) == 1
    assert ratelimits.delete_limit(ws, "api") is True  # no limit: every held job
    assert set(list(_held(jobs).values())[1:]) == {None}
    assert ratelimits.delete_limit(ws, "api") is False
    assert ratelimits.get_limit(ws, "api") is None


@pytest.mark.parametrize("before", [None, 100])
def test_a_limit_set_over_a_backlog_holds_it_back(before):
    """A backlog queued before a first limit (every job given a permit: no limit limits
    nothing), or under a higher one, is dealt the new limit's permits: the limit holds from
    its PUT on, counting the claims already in its window."""
    agent = JobAgentFactory()
    ws = agent.workspace_id
    if before:
        ratelimits.set_limit(ws, "api", before, 3600)
    jobs = _jobs(agent, n=5)
    (first,) = _claim(agent)
    assert first.job.id == jobs[0].id and set(_held(jobs[1:]).values()) == {None}
    ratelimits.set_limit(ws, "api", 2, 3600)
    assert list(_held(jobs[1:]).values()) == [None, True, True, True]
    got = _claim(agent, 10)
    assert [g.job.id for g in got] == [jobs[1].id]
    assert _claim(agent, 10) == []
    assert claimrule.unmet(jobs[2].id) == ["rate_permit"]


def test_the_window_opens_for_the_sweep():
    """Count 2 in 1 s: two claims fill it; once it has passed, the sweep gives the next two
    their permits."""
    agent = JobAgentFactory()
    ratelimits.set_limit(agent.workspace_id, "api", 2, 1)
    _jobs(agent, n=5)
    assert len(_claim(agent, 5)) == 2
    assert _claim(agent, 5) == []
    ratelimits.settle_held_keys()
    assert _claim(agent, 5) == []  # the window has not passed yet
    time.sleep(1.1)
    assert ratelimits.settle_held_keys() == 1  # the reaper's sweep
    assert len(_claim(agent, 5)) == 2
    assert _claim(agent, 5) == []


def test_a_waiting_agent_takes_the_next_job_when_the_window_opens():
    """Nothing a client does opens the window: the admission (PostgreSQL) or the claim
    (SQLite) announced the key for then, and the hubs settle it when the time comes."""
    from jobqueue import wakeups

    agent = JobAgentFactory()
    ratelimits.set_limit(agent.workspace_id, "api", 1, 2)
    first, second = _jobs(agent, n=2)
    (grant,) = _claim(agent)
    claimed_at = time.monotonic()
    assert grant.job.id == first.id
    got = {}
    waiter = threading.Thread(target=lambda: (got.update(
        grants=lifecycle.claim_next(agent, wait_seconds=10)), connection.close()))
    waiter.start()
    assert wakeups.hub().connected.wait(5)
    waiter.join(15)
    assert [g.job.id for g in got["grants"]] == [second.id]
    waited = time.monotonic() - claimed_at
    assert 1.5 < waited < 5  # when the window opened, not at the wait's deadline


def test_a_job_that_is_not_due_takes_no_permit():
    import datetime as dt

    from django.utils import timezone

    agent = JobAgentFactory()
    ratelimits.set_limit(agent.workspace_id, "api", 1, 3600)
    (later,) = _jobs(agent, priority=9, available_at=timezone.now() + dt.timedelta(hours=1))
    (ready,) = _jobs(agent)
    assert _held([later, ready]) == {later.id: True, ready.id: None}


def test_a_paused_agents_job_gives_its_permit_to_another_agents():
    a = JobAgentFactory()
    b = JobAgentFactory(workspace=a.workspace)
    ratelimits.set_limit(a.workspace_id, "api", 1, 3600)
    (mine,) = _jobs(a, priority=5)
    (theirs,) = _jobs(b)
    assert _held([mine, theirs]) == {mine.id: None, theirs.id: True}
    lifecycle.pause_job_agent(a, actor="test")
    assert _held([mine, theirs]) == {mine.id: True, theirs.id: None}
    assert [g.job.id for g in _claim(b)] == [theirs.id]
    lifecycle.resume_job_agent(a, actor="test")
    assert _claim(a) == []  # the window's one claim is b's


def test_labelled_jobs_of_a_key_share_its_permits_across_agents():
    agent = JobAgentFactory(labels=["gpu"])
    other = JobAgentFactory(workspace=agent.workspace, labels=["gpu", "linux"])
    ws = agent.workspace
    ratelimits.set_limit(ws.id, "model", 2, 3600)
    jobs = [lifecycle.create_job(workspace=ws, labels=["gpu"], rate_limit_key="model").job
            for _ in range(4)]
    got = [g.job.id for g in _claim(agent)] + [g.job.id for g in _claim(other, 5)]
    assert got == [jobs[0].id, jobs[1].id]
    assert _claim(agent) == [] and _claim(other) == []


def test_a_job_with_both_keys_waits_for_both_without_a_deadlock():
    """Concurrency limit 1 and a rate of 1 a second: a permit goes only to a job that holds
    its slot (else a job with a permit could wait on a slot whose holder waits on the
    permit). Three jobs drain, one at a time, one a second."""
    agent = JobAgentFactory()
    ratelimits.set_limit(agent.workspace_id, "api", 1, 1)
    jobs = [JobFactory(job_agent=agent, rate_limit_key="api", concurrency_key="c",
                       concurrency_limit=1) for _ in range(3)]
    rows = {j.id: Job.objects.values_list("concurrency_held", "rate_held").get(id=j.id)
            for j in jobs}
    assert list(rows.values()) == [(None, None), (True, True), (True, True)]
    done = []
    deadline = time.monotonic() + 10
    while len(done) < 3 and time.monotonic() < deadline:
        grants = _claim(agent, 5)
        assert len(grants) <= 1
        _done(agent, grants)
        done += [g.job.id for g in grants]
        if not grants:
            time.sleep(0.2)
            ratelimits.settle_held_keys()
    assert done == [j.id for j in jobs]


@pytest.mark.parametrize("how", ["dispatched", "requeued"])
def test_a_job_entering_the_queue_while_its_slot_is_taken_takes_no_permit(how):
    """A job with both keys that enters the queue by an update while its concurrency key's
    slot is taken is held for its slot before a permit is dealt: the permit goes to the
    key's next job a claim can take (SQLite ran its rate trigger first: migration 0034)."""
    agent = JobAgentFactory()
    ws = agent.workspace
    ratelimits.set_limit(ws.id, "api", 1, 3600)
    slot = JobFactory(job_agent=agent, concurrency_key="c")
    assert [g.job.id for g in _claim(agent)] == [slot.id]
    both = lifecycle.create_job(workspace=ws, job_agent=agent, hold=True, concurrency_key="c",
                                rate_limit_key="api").job
    if how == "dispatched":
        lifecycle.dispatch_job(both.id)
    else:
        lifecycle.cancel_job(both.id, actor="test")
        lifecycle.requeue_job(both.id, actor="test")
    assert Job.objects.values_list("status", "concurrency_held", "rate_held").get(
        id=both.id) == (states.QUEUED, True, True)
    (rated,) = _jobs(agent)
    assert _held([rated]) == {rated.id: None}
    assert [g.job.id for g in _claim(agent, 5)] == [rated.id]


def test_sqlites_settle_statement_is_its_triggers():
    import importlib
    import re

    from jobqueue import sql

    migration = importlib.import_module("jobqueue.migrations.0029_rate_limits")

    def words(text):
        return re.sub(r"\s+", " ", re.sub(r"\(\s+", "(", re.sub(r"\s+\)", ")", text))).strip()

    assert words(dict(sql.sqlite)["rate_admit"]) == words(
        migration.sqlite_admit("%(workspace)s", "%(key)s"))


@pytest.mark.postgres_only
def test_racing_claimers_never_pass_the_limit():
    """8 claimers drain 60 jobs of a key at 4 a second: no window of a second (on the
    database's clock) holds more than 4 claims; every job runs once."""
    agent = JobAgentFactory()
    ratelimits.set_limit(agent.workspace_id, "hot", 4, 1)
    _jobs(agent, "hot", 60)
    done, errors = set(), []
    lock = threading.Lock()
    stop = time.monotonic() + 30

    def claimer():
        try:
            while time.monotonic() < stop:
                with lock:
                    if len(done) >= 60:
                        return
                grants = lifecycle.claim_next(agent, limit=2, wait_seconds=1)
                for g in grants:
                    with lock:
                        assert g.job.id not in done
                        done.add(g.job.id)
                _done(agent, grants)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=claimer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert len(done) == 60
    with connection.cursor() as cur:
        # Every claim's window (a second back from it) on the database's clock.
        cur.execute("SELECT max(n) FROM (SELECT (SELECT count(*) FROM job o "
                    "WHERE o.rate_limit_key = 'hot' AND o.started_at > j.started_at "
                    "- interval '1 second' AND o.started_at <= j.started_at) AS n "
                    "FROM job j WHERE j.rate_limit_key = 'hot') w")
        assert cur.fetchone()[0] <= 4


class _KeyLocked:
    """Another transaction holds the key's lock (as a racing create or cancel would)."""

    def __init__(self, workspace_id, key):
        import psycopg

        d = connection.settings_dict
        self.conn = psycopg.connect(dbname=d["NAME"], user=d.get("USER") or "postgres",
                                    host=d.get("HOST") or "127.0.0.1",
                                    port=d.get("PORT") or 5432)
        self.conn.execute("SELECT pg_advisory_xact_lock(hashtextextended("
                          "'jobqueue.rate:' || %s::text || ':' || %s, 0))",
                          [str(workspace_id), key])

    def release(self):
        self.conn.rollback()
        self.conn.close()


@pytest.mark.postgres_only
@pytest.mark.parametrize("key", ["k", "deploy prod", "50% off"])
def test_a_permit_freed_while_another_holds_the_key_is_given_out_by_the_hub(key):
    """Keys with a space or % travel escaped in the announcement."""
    from jobqueue import wakeups

    agent = JobAgentFactory()
    ratelimits.set_limit(agent.workspace_id, key, 1, 3600)
    first, second = _jobs(agent, key, 2)
    got = {}
    # Another agent waits for the second job (the first, which holds the permit, is the
    # agent's own: its cancel frees the permit).
    other = JobAgentFactory(workspace=agent.workspace)
    Job.objects.filter(id=second.id).update(job_agent=other)
    waiter = threading.Thread(target=lambda: (got.update(
        grants=lifecycle.claim_next(other, wait_seconds=15)), connection.close()))
    waiter.start()
    assert wakeups.hub().connected.wait(5)
    time.sleep(0.3)  # the waiter has checked once and waits
    lock = _KeyLocked(agent.workspace_id, key)
    try:
        lifecycle.cancel_job(first.id, actor="test")
        assert _held([second]) == {second.id: True}  # the cancel could not give it out
        time.sleep(0.3)
    finally:
        lock.release()
    started = time.monotonic()
    waiter.join(15)
    assert [g.job.id for g in got["grants"]] == [second.id]
    assert time.monotonic() - started < 5  # the hub's retries, not the wait's deadline


@pytest.mark.postgres_only
def test_the_reapers_sweep_settles_a_key_no_hub_heard():
    from jobqueue.maintenance import reaper

    agent = JobAgentFactory()
    ratelimits.set_limit(agent.workspace_id, "k", 1, 3600)
    first, second = _jobs(agent, "k", 2)
    lock = _KeyLocked(agent.workspace_id, "k")
    try:
        lifecycle.cancel_job(first.id, actor="test")
    finally:
        lock.release()
    assert _claim(agent) == []  # held: nobody gave the freed permit out yet
    reaper.sweep(record=False)
    assert [g.job.id for g in _claim(agent)] == [second.id]


@pytest.mark.postgres_only
@pytest.mark.parametrize("limit", [1, 10])
def test_a_claim_never_reads_a_held_back_job(limit):
    """3,000 jobs of one key wait ahead of everything else in claim order (higher priority);
    the claim reads the agent's claim index and at most `limit` rows of it: none held."""
    import json

    from jobqueue.lifecycle.pg import claim_statement

    agent = JobAgentFactory()
    ratelimits.set_limit(agent.workspace_id, "flood", 1, 3600)
    _jobs(agent, "flood", 1, priority=50)
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO job (id, workspace_id, job_agent_id, status, job_agent_config, "
            "dispatch_context, message, external_id, attempt, max_attempts, "
            "initial_max_attempts, priority, available_at, idempotency_fingerprint, "
            "created_at, updated_at, rate_limit_key) "
            "SELECT gen_random_uuid(), %s, %s, 'queued', '{}', '{}', '', '', 0, 3, 3, 50, "
            "now() - interval '1 hour', '', now(), now(), 'flood' "
            "FROM generate_series(1, 3000)", [agent.workspace_id, agent.id])
        cur.execute("ANALYZE job")
    plain = [JobFactory(job_agent=agent) for _ in range(12)]
    assert Job.objects.filter(rate_limit_key="flood", rate_held=True).count() == 3000
    params = {"agent": agent.id, "limit": limit, "lease": 60, "kind": "claimed",
              "actor": "test", "holder": "", "key": None}
    with connection.cursor() as cur:
        cur.execute("BEGIN")
        try:
            cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + claim_statement(limit), params)
            (plan,) = cur.fetchone()
        finally:
            cur.execute("ROLLBACK")
    plan = plan if isinstance(plan, list) else json.loads(plan)

    def nodes(node):
        yield node
        for child in node.get("Plans", ()):
            yield from nodes(child)

    scans = [n for n in nodes(plan[0]["Plan"]) if n.get("Relation Name") == "job"
             and n["Node Type"].startswith("Index")]
    claim_scan = next(n for n in scans if n["Index Name"] == "job_claim_order_idx")
    assert claim_scan["Actual Rows"] <= limit
    assert claim_scan.get("Rows Removed by Filter", 0) == 0
    got = {g.job.id for g in _claim(agent, limit)}
    flood = set(Job.objects.filter(rate_limit_key="flood").values_list("id", flat=True))
    assert len(got & flood) == 1 and len(got) == limit
    assert got - flood <= {j.id for j in plain}


def test_a_job_with_both_keys_gets_no_permit_before_its_slot():
    """Permits to spare, the slot taken: the second job waits for its slot without a permit
    (SQLite fires its insert triggers newest first: the slot's is made after the permit's)."""
    agent = JobAgentFactory()
    ratelimits.set_limit(agent.workspace_id, "api", 5, 3600)
    jobs = [JobFactory(job_agent=agent, rate_limit_key="api", concurrency_key="c",
                       concurrency_limit=1) for _ in range(2)]
    jobs.append(lifecycle.create_job(workspace=agent.workspace, job_agent=agent,
                                     rate_limit_key="api", concurrency_key="c").job)
    rows = [Job.objects.values_list("concurrency_held", "rate_held").get(id=j.id)
            for j in jobs]
    assert rows == [(None, None), (True, True), (True, True)]
    only_rate = _jobs(agent)[0]
    assert _held([only_rate]) == {only_rate.id: None}


def test_a_held_job_that_becomes_due_with_a_permit_free_is_taken_when_due():
    """A permit is free but the job is not due: the key is settled again when it is (not when
    the window opens, an hour later), and a waiting agent takes it."""
    import datetime as dt

    from django.utils import timezone

    from jobqueue import wakeups

    agent = JobAgentFactory()
    other = JobAgentFactory(workspace=agent.workspace)
    ratelimits.set_limit(agent.workspace_id, "api", 5, 3600)
    (later,) = _jobs(agent, available_at=timezone.now() + dt.timedelta(seconds=1))
    _jobs(other)
    assert len(_claim(other)) == 1  # a claim of the key: it is settled, and announced
    got = {}
    started = time.monotonic()
    waiter = threading.Thread(target=lambda: (got.update(
        grants=lifecycle.claim_next(agent, wait_seconds=10)), connection.close()))
    waiter.start()
    assert wakeups.hub().connected.wait(5)
    waiter.join(15)
    assert [g.job.id for g in got["grants"]] == [later.id]
    assert time.monotonic() - started < 5


def test_a_hub_keeps_one_timer_a_rate_limit_key():
    """Every hub's settle announces the key's next window: each hub keeps one timer for it
    (else the timers, and the settles, multiply with the hubs at each opening)."""
    from jobqueue import wakeups

    hub = wakeups.Hub()
    try:
        key = wakeups.rate_key("ws", "api")
        for _ in range(5):
            hub.deliver(f"{key} 30")
        hub.deliver(f"{key} 60")
        hub.deliver(f"{wakeups.rate_key('ws', 'other')} 30")
        assert sorted(k for _, k in hub._timers) == [key, wakeups.rate_key("ws", "other")]
        hub.deliver(f"{key} 1")  # an earlier one is kept too
        assert [k for _, k in hub._timers].count(key) == 2
    finally:
        hub.close()


def test_the_recheck_settles_a_held_key_without_a_timer_once_in_a_while(monkeypatch):
    from jobqueue import wakeups

    agent = JobAgentFactory()
    ratelimits.set_limit(agent.workspace_id, "api", 1, 3600)
    _jobs(agent, n=2)
    settled = []
    monkeypatch.setattr(ratelimits, "settle_key", lambda ws, key: settled.append(key))
    hub = wakeups.Hub()
    try:
        hub._settle_unwatched_rate_keys()
        hub._settle_unwatched_rate_keys()
        assert settled == ["api"]
    finally:
        hub.close()


def test_a_claim_is_answered_when_settling_its_key_fails(monkeypatch, caplog):
    """The claim has committed: a failed settle after it is logged (the sweep settles the key
    later), never turned into an error of the claim."""
    agent = JobAgentFactory()
    ratelimits.set_limit(agent.workspace_id, "api", 5, 3600)
    (job,) = _jobs(agent)

    def broken(keys):
        raise RuntimeError("the database went away")

    monkeypatch.setattr(ratelimits, "settle_keys", broken)
    (grant,) = _claim(agent)
    assert grant.job.id == job.id
    assert "settling rate limit keys after a claim failed" in caplog.text


def test_a_key_another_transaction_holds_is_announced(monkeypatch):
    """settle_keys: a key whose lock another transaction holds is announced for the hubs."""
    from jobqueue import wakeups
    from jobqueue.lifecycle.backends import backend

    agent = JobAgentFactory()
    announced = []
    monkeypatch.setattr(type(backend()), "settle_rate", lambda self, ws, key: False)
    monkeypatch.setattr(wakeups, "announce", lambda key, delay=0: announced.append(key))
    ratelimits.settle_keys([(agent.workspace_id, "api")])
    assert announced == [wakeups.rate_key(agent.workspace_id, "api")]


def test_a_recheck_whose_rate_settle_fails_still_wakes_its_waiters(monkeypatch, caplog):
    from jobqueue import wakeups

    hub = wakeups.Hub()
    woken = []
    try:
        monkeypatch.setattr(hub, "keys", lambda: ["j:00000000-0000-0000-0000-000000000000"])
        monkeypatch.setattr(hub, "wake_key", woken.append)

        def broken():
            raise RuntimeError("the database went away")

        monkeypatch.setattr(hub, "_settle_unwatched_rate_keys", broken)
        hub.recheck()
        assert "settling rate limit keys at the re-check failed" in caplog.text
    finally:
        hub.close()


@pytest.mark.postgres_only
def test_a_slot_update_of_a_job_holding_its_permit_runs_no_admission():
    """job_flow_slotted (migration 0033) settles a rate limited job given its concurrency
    slot only while the job is held for its permit: an update of concurrency_held on a job
    that holds its permit (rate_held NULL) takes no key lock and announces nothing, as the
    old trigger's WHEN did not fire (a NULL condition must not reach the admission)."""
    from django.db import transaction

    agent = JobAgentFactory()
    ratelimits.set_limit(agent.workspace_id, "api", 1, 3600)
    job, held = _jobs(agent, n=2)
    assert _held([job, held]) == {job.id: None, held.id: True}
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("UPDATE job SET concurrency_held = NULL WHERE id = %s", [job.id])
        cur.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                    "AND pid = pg_backend_pid()")
        assert cur.fetchone()[0] == 0
    with transaction.atomic(), connection.cursor() as cur:
        # The held one given its slot: its key is settled (it stays held: no permit free).
        cur.execute("UPDATE job SET concurrency_held = true WHERE id = %s", [held.id])
        cur.execute("UPDATE job SET concurrency_held = NULL WHERE id = %s", [held.id])
        cur.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                    "AND pid = pg_backend_pid()")
        assert cur.fetchone()[0] == 1
