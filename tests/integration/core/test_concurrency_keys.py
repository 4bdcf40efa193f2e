"""Concurrency keys (#29 item 1) in the core: a key's slots go to its jobs in claim order, a
claim never takes a held job, a slot freed by any path goes to the next held job at once, and
racing claims never run more than the limit (PostgreSQL)."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from jobqueue import claimrule, lifecycle, states
from jobqueue.lifecycle import concurrency
from jobqueue.lifecycle.inputs import ReportItem
from jobqueue.models import Job
from tests.factories import JobAgentFactory, JobFactory

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("wakeups_stopped_after")]


def _keyed(agent, key="tenant-a", limit=1, n=1, **extra):
    return [JobFactory(job_agent=agent, concurrency_key=key, concurrency_limit=limit, **extra)
            for _ in range(n)]


def _held(jobs):
    return {j.id: Job.objects.get(id=j.id).concurrency_held for j in jobs}


def _running(agent, key):
    return Job.objects.filter(workspace_id=agent.workspace_id, concurrency_key=key,
                              status=states.IN_PROGRESS).count()


def _claim(agent, limit=None):
    return lifecycle.claim_next(agent, limit=limit or 1)


def test_a_key_gives_its_limit_of_slots_in_claim_order():
    agent = JobAgentFactory()
    first = JobFactory(job_agent=agent, concurrency_key="k", concurrency_limit=2, priority=5)
    rest = _keyed(agent, "k", 2, 3)
    held = _held([first, *rest])
    assert held[first.id] is None and held[rest[0].id] is None
    assert [held[j.id] for j in rest[1:]] == [True, True]
    # Claims take the two with a slot, then nothing, however many ask.
    got = _claim(agent, 10)
    assert {g.job.id for g in got} == {first.id, rest[0].id}
    assert _claim(agent, 10) == []
    assert claimrule.unmet(rest[1].id) == ["concurrency_slot"]


def test_a_named_claim_of_a_held_job_is_409_job_not_claimable():
    from jobqueue.exceptions import JobNotClaimable

    agent = JobAgentFactory()
    first, second = _keyed(agent, "k", 1, 2)
    with pytest.raises(JobNotClaimable):
        lifecycle.claim_job(agent, second.id)
    assert lifecycle.claim_job(agent, first.id).job.id == first.id


def test_a_plain_job_pays_nothing_and_is_never_held():
    agent = JobAgentFactory()
    plain = JobFactory(job_agent=agent)
    row = Job.objects.values("concurrency_key", "concurrency_limit", "concurrency_held").get(
        id=plain.id)
    assert row == {"concurrency_key": None, "concurrency_limit": None, "concurrency_held": None}


def test_a_held_job_never_holds_back_other_keys_or_plain_jobs():
    agent = JobAgentFactory()
    _keyed(agent, "busy", 1, 5, priority=9)
    other = _keyed(agent, "other", 1, 1)[0]
    plain = JobFactory(job_agent=agent)
    got = {g.job.id for g in _claim(agent, 10)}
    assert other.id in got and plain.id in got and len(got) == 3


@pytest.mark.parametrize("path", ["report", "batch_report", "release", "fail_retry",
                                  "cancel", "requeue", "reap", "group_cancel", "delete"])
def test_a_slot_freed_by_any_path_goes_to_the_next_job(path):
    agent = JobAgentFactory()
    jobs = _keyed(agent, "k", 1, 3)
    if path == "group_cancel":
        other = lifecycle.create_job(workspace=agent.workspace, job_agent=agent, group="g")
        lifecycle.cancel_job(other.job.id, actor="test")
        Job.objects.filter(id=jobs[0].id).update(group="g")
    (grant,) = _claim(agent)
    assert grant.job.id == jobs[0].id
    assert _claim(agent) == []
    if path == "report":
        lifecycle.report_status(grant.job.id, grant.claim_id, states.SUCCESSFUL,
                                job_agent_id=agent.id)
    elif path == "batch_report":
        lifecycle.report_many(agent.id, [ReportItem(grant.job.id, grant.claim_id,
                                                    states.SUCCESSFUL)])
    elif path == "release":
        lifecycle.release_job(grant.job.id, grant.claim_id, job_agent_id=agent.id,
                              retry_after_seconds=3600)
    elif path == "fail_retry":
        Job.objects.filter(id=grant.job.id).update(max_attempts=5)
        lifecycle.report_status(grant.job.id, grant.claim_id, states.FAILURE,
                                job_agent_id=agent.id, retry=True)
    elif path == "cancel":
        lifecycle.cancel_job(grant.job.id, actor="test")
    elif path == "requeue":
        lifecycle.requeue_job(grant.job.id, actor="test")
    elif path == "reap":
        from jobqueue.models import JobClaim

        JobClaim.objects.filter(job_id=grant.job.id).update(
            claim_expires_at="2000-01-01T00:00:00Z")
        lifecycle.reap_expired_claims_once(100, actor="reaper")
    elif path == "group_cancel":
        lifecycle.cancel_group(agent.workspace_id, "g", actor="test")
    elif path == "delete":
        Job.objects.filter(id=grant.job.id).delete()
    nxt = _claim(agent)
    assert len(nxt) == 1, path
    if path == "requeue":  # back in the queue first in claim order: it takes its slot again
        assert nxt[0].job.id in {jobs[0].id, jobs[1].id}
    else:
        assert nxt[0].job.id == jobs[1].id, path
    assert _running(agent, "k") == 1
    assert _claim(agent) == []


def test_labelled_jobs_of_a_key_share_its_slots_across_agents():
    agent = JobAgentFactory(labels=["gpu"])
    other = JobAgentFactory(workspace=agent.workspace, labels=["gpu", "linux"])
    ws = agent.workspace
    jobs = [lifecycle.create_job(workspace=ws, labels=["gpu"], concurrency_key="model",
                                 concurrency_limit=2).job for _ in range(4)]
    got = [g.job.id for g in _claim(agent)] + [g.job.id for g in _claim(other, 5)]
    assert got == [jobs[0].id, jobs[1].id]
    assert _claim(agent) == [] and _claim(other) == []


def test_keys_and_limits_belong_to_one_workspace():
    a, b = JobAgentFactory(), JobAgentFactory()
    _keyed(a, "shared", 1, 2)
    _keyed(b, "shared", 1, 2)
    assert len(_claim(a, 5)) == 1 and len(_claim(b, 5)) == 1


def test_a_pending_job_waits_for_a_slot_when_its_dependencies_release_it():
    agent = JobAgentFactory()
    ws = agent.workspace
    parent = lifecycle.create_job(workspace=ws, job_agent=agent).job
    (busy,) = _keyed(agent, "k", 1, 1)
    child = lifecycle.create_job(workspace=ws, job_agent=agent, depends_on=[parent.id]).job
    Job.objects.filter(id=child.id).update(concurrency_key="k", concurrency_limit=1)
    grants = {g.job.id: g for g in _claim(agent, 10)}
    assert set(grants) == {parent.id, busy.id}
    lifecycle.report_status(parent.id, grants[parent.id].claim_id, states.SUCCESSFUL,
                            job_agent_id=agent.id)
    child.refresh_from_db()
    assert child.status == states.QUEUED and child.concurrency_held is True
    lifecycle.report_status(busy.id, grants[busy.id].claim_id, states.SUCCESSFUL,
                            job_agent_id=agent.id)
    assert [g.job.id for g in _claim(agent)] == [child.id]


@pytest.mark.postgres_only
def test_racing_claimers_never_run_more_than_the_limit():
    """8 claimers, 200 jobs of one key at limit 3: the running count, read right after every
    claim returns (before its jobs are reported), never passes 3; every job runs once."""
    agent = JobAgentFactory()
    _keyed(agent, "hot", 3, 200)
    seen, done, errors = [], set(), []
    lock = threading.Lock()

    def claimer():
        try:
            while True:
                with lock:
                    if len(done) >= 200:
                        return
                grants = lifecycle.claim_next(agent, limit=2)
                with connection.cursor() as cur:
                    cur.execute("SELECT count(*) FROM job WHERE concurrency_key = 'hot' "
                                "AND status = 'in_progress'")
                    running = cur.fetchone()[0]
                with lock:
                    seen.append(running)
                if not grants:
                    # A report whose trigger found the key's lock taken announced the key
                    # for the wake-up hubs, which this test does not run: settle it as the
                    # maintenance sweep does (a busy machine made this test wait for good).
                    concurrency.settle_held_keys()
                for g in grants:
                    lifecycle.report_status(g.job.id, g.claim_id, states.SUCCESSFUL,
                                            job_agent_id=agent.id)
                    with lock:
                        assert g.job.id not in done
                        done.add(g.job.id)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=claimer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert len(done) == 200
    assert max(seen) <= 3
    assert Job.objects.filter(concurrency_key="hot", concurrency_held=True).count() == 0


class _KeyLocked:
    """Another transaction holds the key's lock (as a racing create or release would)."""

    def __init__(self, workspace_id, key):
        import psycopg

        d = connection.settings_dict
        self.conn = psycopg.connect(dbname=d["NAME"], user=d.get("USER") or "postgres",
                                    host=d.get("HOST") or "127.0.0.1",
                                    port=d.get("PORT") or 5432)
        self.conn.execute("SELECT pg_advisory_xact_lock(hashtextextended("
                          "'jobqueue.concurrency:' || %s::text || ':' || %s, 0))",
                          [str(workspace_id), key])

    def release(self):
        self.conn.rollback()
        self.conn.close()


@pytest.mark.postgres_only
@pytest.mark.parametrize("key", ["k", "deploy prod", "50% off"])
def test_a_slot_freed_while_another_holds_the_key_is_given_out_by_the_hub(key):
    """Keys with a space or % travel escaped in the announcement."""
    import time

    from jobqueue import wakeups

    agent = JobAgentFactory()
    _, second = _keyed(agent, key, 1, 2)
    (grant,) = _claim(agent)
    got = {}
    waiter = threading.Thread(target=lambda: (got.update(
        grants=lifecycle.claim_next(agent, wait_seconds=15)), connection.close()))
    waiter.start()
    assert wakeups.hub().connected.wait(5)
    time.sleep(0.3)  # the waiter has checked once and waits
    lock = _KeyLocked(agent.workspace_id, key)
    try:
        lifecycle.report_status(grant.job.id, grant.claim_id, states.SUCCESSFUL,
                                job_agent_id=agent.id)
        assert _held([second]) == {second.id: True}  # the report could not give it out
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
    _, second = _keyed(agent, "k", 1, 2)
    (grant,) = _claim(agent)
    lock = _KeyLocked(agent.workspace_id, "k")
    try:
        lifecycle.report_status(grant.job.id, grant.claim_id, states.SUCCESSFUL,
                                job_agent_id=agent.id)
    finally:
        lock.release()
    assert _claim(agent) == []  # held: nobody gave the freed slot out yet
    reaper.sweep(record=False)
    assert [g.job.id for g in _claim(agent)] == [second.id]


@pytest.mark.postgres_only
@pytest.mark.parametrize("limit", [1, 10])
def test_a_claim_never_reads_a_held_back_job(limit):
    """3,000 jobs of one key wait ahead of everything else in claim order (higher priority);
    the claim reads the agent's claim index and at most `limit` rows of it: none of them."""
    import json

    from jobqueue.lifecycle.pg import claim_statement

    agent = JobAgentFactory()
    _keyed(agent, "flood", 1, 1, priority=50)
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO job (id, workspace_id, job_agent_id, status, job_agent_config, "
            "dispatch_context, message, external_id, attempt, max_attempts, "
            "initial_max_attempts, priority, available_at, idempotency_fingerprint, "
            "created_at, updated_at, concurrency_key, concurrency_limit) "
            "SELECT gen_random_uuid(), %s, %s, 'queued', '{}', '{}', '', '', 0, 3, 3, 50, "
            "now() - interval '1 hour', '', now(), now(), 'flood', 1 "
            "FROM generate_series(1, 3000)", [agent.workspace_id, agent.id])
        cur.execute("ANALYZE job")
    plain = [JobFactory(job_agent=agent) for _ in range(12)]
    assert Job.objects.filter(concurrency_key="flood", concurrency_held=True).count() == 3000
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
    assert {n["Index Name"] for n in scans} >= {"job_claim_order_idx"}
    claim_scan = next(n for n in scans if n["Index Name"] == "job_claim_order_idx")
    assert claim_scan["Actual Rows"] <= limit
    assert claim_scan.get("Rows Removed by Filter", 0) == 0
    got = {g.job.id for g in _claim(agent, limit)}
    flood = set(Job.objects.filter(concurrency_key="flood").values_list("id", flat=True))
    # the key's one slot first (priority 50), then the plain jobs; no second job of the key
    assert len(got & flood) == 1 and len(got) == limit
    assert got - flood <= {j.id for j in plain}


def test_a_job_that_is_not_due_takes_no_slot():
    """A held-back job whose available_at has not come is passed over: the slot goes to the
    next one a claim could take now."""
    import datetime as dt

    from django.utils import timezone

    agent = JobAgentFactory()
    (running,) = _keyed(agent, "k", 1, 1)
    (grant,) = _claim(agent)
    (later,) = _keyed(agent, "k", 1, 1, priority=9,
                      available_at=timezone.now() + dt.timedelta(hours=1))
    (ready,) = _keyed(agent, "k", 1, 1)
    lifecycle.report_status(grant.job.id, grant.claim_id, states.SUCCESSFUL,
                            job_agent_id=agent.id)
    assert _held([later, ready]) == {later.id: True, ready.id: None}
    assert [g.job.id for g in _claim(agent)] == [ready.id]


def test_a_job_that_becomes_due_gets_the_free_slot_when_the_key_is_settled():
    import datetime as dt
    import time

    from django.utils import timezone

    from jobqueue.lifecycle import concurrency

    agent = JobAgentFactory()
    (later,) = _keyed(agent, "k", 1, 1,
                      available_at=timezone.now() + dt.timedelta(seconds=1))
    assert _held([later]) == {later.id: True}
    time.sleep(1.2)
    concurrency.settle_held_keys()  # the reaper's sweep
    assert [g.job.id for g in _claim(agent)] == [later.id]


def test_a_paused_agents_job_gives_its_slot_to_another_agents():

    a = JobAgentFactory()
    b = JobAgentFactory(workspace=a.workspace)
    (mine,) = _keyed(a, "deploy", 1, 1, priority=5)
    (theirs,) = _keyed(b, "deploy", 1, 1)
    assert _held([mine, theirs]) == {mine.id: None, theirs.id: True}
    lifecycle.pause_job_agent(a, actor="test")
    assert _held([mine, theirs]) == {mine.id: True, theirs.id: None}
    (grant,) = _claim(b)
    assert grant.job.id == theirs.id
    lifecycle.resume_job_agent(a, actor="test")
    assert _claim(a) == []  # the key's one slot is b's job's, in progress
    lifecycle.report_status(grant.job.id, grant.claim_id, states.SUCCESSFUL,
                            job_agent_id=b.id)
    assert [g.job.id for g in _claim(a)] == [mine.id]


def test_sqlites_settle_statement_is_its_triggers():
    import importlib
    import re

    from jobqueue import sql

    migration = importlib.import_module("jobqueue.migrations.0027_job_concurrency_keys")

    def words(text):
        return re.sub(r"\s+", " ", re.sub(r"\(\s+", "(", re.sub(r"\s+\)", ")", text))).strip()

    assert words(dict(sql.sqlite)["concurrency_admit"]) == words(
        migration.sqlite_admit("%(workspace)s", "%(key)s"))


@pytest.mark.postgres_only
def test_a_slot_whose_next_job_another_transaction_holds_is_given_by_the_sweep():
    """The held-back job's row is locked by another transaction (an edit of it) while the
    slot frees: it is passed over (nothing waits for it), and the reaper's sweep gives the
    slot once the row is free."""
    import psycopg

    from jobqueue.maintenance import reaper

    agent = JobAgentFactory()
    _, second = _keyed(agent, "k", 1, 2)
    (grant,) = _claim(agent)
    d = connection.settings_dict
    other = psycopg.connect(dbname=d["NAME"], user=d.get("USER") or "postgres",
                            host=d.get("HOST") or "127.0.0.1", port=d.get("PORT") or 5432)
    try:
        other.execute("SELECT 1 FROM job WHERE id = %s FOR NO KEY UPDATE", [second.id])
        lifecycle.report_status(grant.job.id, grant.claim_id, states.SUCCESSFUL,
                                job_agent_id=agent.id)
        assert _held([second]) == {second.id: True}
    finally:
        other.rollback()
        other.close()
    reaper.sweep(record=False)
    assert [g.job.id for g in _claim(agent)] == [second.id]


@pytest.mark.postgres_only
def test_a_held_back_job_that_becomes_due_is_taken_by_a_waiting_agent():
    """No transition announces a job becoming due: the slot's last release announced the key
    for then, and the hubs settle it when the time comes."""
    import datetime as dt
    import time

    from django.utils import timezone

    from jobqueue import wakeups

    agent = JobAgentFactory()
    (first,) = _keyed(agent, "k", 1, 1)
    (grant,) = _claim(agent)
    (later,) = _keyed(agent, "k", 1, 1,
                      available_at=timezone.now() + dt.timedelta(seconds=1.5))
    got = {}
    waiter = threading.Thread(target=lambda: (got.update(
        grants=lifecycle.claim_next(agent, wait_seconds=15)), connection.close()))
    waiter.start()
    assert wakeups.hub().connected.wait(5)
    time.sleep(0.3)
    lifecycle.report_status(grant.job.id, grant.claim_id, states.SUCCESSFUL,
                            job_agent_id=agent.id)
    waiter.join(15)
    assert [g.job.id for g in got["grants"]] == [later.id]


def test_settling_takes_back_a_slot_a_paused_agents_job_was_given():
    """A pause that an admit did not see yet (it committed after the admit read the agent):
    the next settle of the key gives the slot back to a job another agent can take."""
    from django.db.models.functions import Now

    from jobqueue.lifecycle import concurrency
    from jobqueue.models import JobAgent

    a = JobAgentFactory()
    b = JobAgentFactory(workspace=a.workspace)
    (mine,) = _keyed(a, "deploy", 1, 1, priority=5)
    (theirs,) = _keyed(b, "deploy", 1, 1)
    JobAgent.objects.filter(id=a.id).update(paused_at=Now())
    assert _held([mine, theirs]) == {mine.id: None, theirs.id: True}
    concurrency.settle_held_keys()  # the reaper's sweep
    assert _held([mine, theirs]) == {mine.id: True, theirs.id: None}
    assert [g.job.id for g in _claim(b)] == [theirs.id]


@pytest.mark.postgres_only
def test_a_pause_whose_key_another_transaction_holds_announces_it_for_the_hubs():
    """The pause cannot take the key's lock: it announces the key (escaped), and a hub gives
    the paused agent's slot to another agent's job once the holder let go."""
    import time

    from jobqueue import wakeups

    a = JobAgentFactory()
    b = JobAgentFactory(workspace=a.workspace)
    (mine,) = _keyed(a, "deploy prod", 1, 1, priority=5)
    (theirs,) = _keyed(b, "deploy prod", 1, 1)
    got = {}
    waiter = threading.Thread(target=lambda: (got.update(
        grants=lifecycle.claim_next(b, wait_seconds=15)), connection.close()))
    waiter.start()
    assert wakeups.hub().connected.wait(5)
    time.sleep(0.3)
    lock = _KeyLocked(a.workspace_id, "deploy prod")
    try:
        lifecycle.pause_job_agent(a, actor="test")
        assert _held([mine, theirs]) == {mine.id: None, theirs.id: True}  # not yet
        time.sleep(0.3)
    finally:
        lock.release()
    waiter.join(15)
    assert [g.job.id for g in got["grants"]] == [theirs.id]
    assert _held([mine]) == {mine.id: True}


def test_a_hub_that_cannot_settle_a_key_leaves_it_to_the_sweep(caplog):
    """A settle that fails (here: no such workspace id) is logged and not retried."""
    from jobqueue import wakeups

    hub = wakeups.Hub()
    try:
        hub.settle(wakeups.concurrency_key("not-a-workspace", "k"))
        assert hub._timers == [] and hub._settle_tries == {}
        assert "settling key k:" in caplog.text
    finally:
        hub.close()
