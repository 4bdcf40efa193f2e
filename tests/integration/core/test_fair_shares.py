"""Fair shares (#29 item 2) in the core: a claim shares its agent's jobs among their fairness
keys in proportion to the keys' weights, whatever number each has queued; within a key claim
order holds; a key with nothing claimable takes nothing; priority outranks fairness; a job
without a key keeps its place by time."""

from __future__ import annotations

import collections

import pytest
from django.db import connection, transaction
from django.db.models.functions import Now

from jobqueue import lifecycle, states
from jobqueue.lifecycle import fairness
from jobqueue.models import Job
from tests.factories import JobAgentFactory

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("wakeups_stopped_after")]


def _create(agent, key, n=1, **extra):
    if n >= 1000 and not extra:  # flows of 1,000 (their places: flows._place_fairly)
        made = []
        for start in range(0, n, 1000):
            made += lifecycle.create_flow(workspace=agent.workspace, jobs=[
                lifecycle.FlowJob(ref=f"j{i}", job_agent=agent, fairness_key=key)
                for i in range(start, min(n, start + 1000))]).values()
        return made
    with transaction.atomic():  # one commit for the lot (each create is its own savepoint)
        return [lifecycle.create_job(workspace=agent.workspace, job_agent=agent,
                                     fairness_key=key, **extra).job for _ in range(n)]


def _drain(agent, n, batch=1):
    """Claim (and report) n jobs, `batch` a claim: their keys in claim order."""
    keys = []
    while len(keys) < n:
        grants = lifecycle.claim_next(agent, limit=min(batch, n - len(keys)))
        if not grants:
            break
        for g in grants:
            keys.append(g.job.fairness_key)
            lifecycle.report_status(g.job.id, g.claim_id, states.SUCCESSFUL,
                                    job_agent_id=agent.id)
    return keys


def _the_contracts_example(backlog):
    """Key A has `backlog` jobs queued (a few claimed already), then key B enqueues 100 of
    equal weight: B's jobs are claimed within about the next 200 claims, not after A's."""
    agent = JobAgentFactory()
    _create(agent, "A", backlog)
    assert _drain(agent, 10) == ["A"] * 10
    _create(agent, "B", 100)
    keys = _drain(agent, 220)
    last_b = max(i for i, k in enumerate(keys) if k == "B")
    assert keys.count("B") == 100 and last_b < 205, last_b
    assert collections.Counter(keys[:200])["B"] >= 98  # one for one (A first on a tie)


@pytest.mark.postgres_only
def test_the_contracts_example_with_10000_queued():
    _the_contracts_example(10_000)


def test_the_contracts_example_with_1000_queued():
    _the_contracts_example(1_000)


@pytest.mark.parametrize("batch", [1, 10])
def test_backlogged_keys_share_claims_by_weight(batch):
    """Weights 1, 1 and 2, all backlogged (queued in turn, one key after the other): 400
    claims go 100 / 100 / 200."""
    agent = JobAgentFactory()
    ws = agent.workspace_id
    fairness.set_weight(ws, "heavy", 2)
    _create(agent, "a", 300)
    _create(agent, "b", 300)
    _create(agent, "heavy", 300)
    shares = collections.Counter(_drain(agent, 400, batch))
    assert abs(shares["a"] - 100) <= 2 and abs(shares["b"] - 100) <= 2
    assert abs(shares["heavy"] - 200) <= 2


def test_a_weight_set_later_respaces_the_keys_queued_jobs():
    agent = JobAgentFactory()
    _create(agent, "a", 200)
    _create(agent, "b", 200)
    row = fairness.set_weight(agent.workspace_id, "b", 3)
    assert (row.key, row.weight) == ("b", 3)
    shares = collections.Counter(_drain(agent, 200))
    assert abs(shares["b"] - 150) <= 3, shares
    assert fairness.delete_weight(agent.workspace_id, "b") is True
    assert fairness.delete_weight(agent.workspace_id, "b") is False
    assert fairness.get_weight(agent.workspace_id, "b") is None
    shares = collections.Counter(_drain(agent, 100))
    assert abs(shares["a"] - 50) <= 3, shares


def test_a_key_with_nothing_claimable_takes_nothing():
    """Work-conserving: B's jobs are not due (a delay), so A's go on, one after another."""
    agent = JobAgentFactory()
    _create(agent, "A", 50)
    _create(agent, "B", 50, delay_seconds=3600)
    assert _drain(agent, 60) == ["A"] * 50


def test_within_a_key_claim_order_holds():
    agent = JobAgentFactory()
    mine = _create(agent, "A", 20)
    _create(agent, "B", 20)
    got = []
    while grants := lifecycle.claim_next(agent, limit=3):
        got += [g.job.id for g in grants if g.job.fairness_key == "A"]
    assert got == [j.id for j in mine]


def test_priority_outranks_fairness():
    agent = JobAgentFactory()
    _create(agent, "A", 100)
    _create(agent, "B", 5)
    urgent = _create(agent, "A", 1, priority=9)[0]
    (first,) = lifecycle.claim_next(agent)
    assert first.job.id == urgent.id


def test_a_job_without_a_key_keeps_its_place_by_time():
    """A plain job queued before a fair backlog is taken before it; the fair jobs' places
    are spread from the time the first of them was created, one STEP apiece."""
    agent = JobAgentFactory()
    plain = lifecycle.create_job(workspace=agent.workspace, job_agent=agent).job
    _create(agent, "A", 10)
    (first,) = lifecycle.claim_next(agent)
    assert first.job.id == plain.id
    places = list(Job.objects.filter(fairness_key="A").order_by("fair_at")
                  .values_list("fair_at", flat=True))
    assert all(b - a == fairness.STEP for a, b in zip(places, places[1:], strict=False))


def test_keys_and_weights_belong_to_one_workspace():
    a, b = JobAgentFactory(), JobAgentFactory()
    fairness.set_weight(a.workspace_id, "k", 5)
    assert fairness.weight_of(a.workspace_id, "k") == 5
    assert fairness.weight_of(b.workspace_id, "k") == 1


def test_a_plain_job_pays_nothing():
    agent = JobAgentFactory()
    plain = lifecycle.create_job(workspace=agent.workspace, job_agent=agent).job
    assert Job.objects.values("fairness_key", "fair_at").get(id=plain.id) == {
        "fairness_key": None, "fair_at": None}


def test_labelled_jobs_of_keys_share_across_their_agents_claims():
    agent = JobAgentFactory(labels=["gpu"])
    ws = agent.workspace
    for key, n in (("A", 100), ("B", 10)):
        for _ in range(n):
            lifecycle.create_job(workspace=ws, labels=["gpu"], fairness_key=key)
    keys = _drain(agent, 20)
    assert collections.Counter(keys)["B"] >= 9  # one for one (A first on a tie)


@pytest.mark.postgres_only
def test_the_claim_reads_the_claim_index_in_its_order():
    """The claim's ORDER BY is the claim index's: no sort, at most `limit` rows read."""
    import json

    from jobqueue.lifecycle.pg import claim_statement

    agent = JobAgentFactory()
    _create(agent, "A", 30)
    _create(agent, "B", 30)
    with connection.cursor() as cur:
        cur.execute("ANALYZE job")
        cur.execute("SET enable_seqscan = off")
        cur.execute("BEGIN")
        try:
            cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + claim_statement(5), {
                "agent": agent.id, "limit": 5, "lease": 60, "kind": "claimed",
                "actor": "test", "holder": "", "key": None})
            (plan,) = cur.fetchone()
        finally:
            cur.execute("ROLLBACK")
            cur.execute("RESET enable_seqscan")
    plan = plan if isinstance(plan, list) else json.loads(plan)

    def nodes(node):
        yield node
        for child in node.get("Plans", ()):
            yield from nodes(child)

    found = list(nodes(plan[0]["Plan"]))
    scan = next(n for n in found if n.get("Index Name") == "job_claim_order_idx")
    assert scan["Actual Rows"] <= 5
    assert not any(n["Node Type"] == "Sort" and "job" in json.dumps(n.get("Sort Key", ""))
                   and "fair_at" in json.dumps(n.get("Sort Key", "")) for n in found)


def test_a_queue_nobody_claims_from_holds_back_no_others_share():
    """An agent that is offline (or paused) with fair jobs queued long ago: another agent's
    keys still interleave (each queue has its own virtual time), where one virtual time for
    the workspace would put a newcomer's jobs all before the others'."""
    import datetime as dt

    idle = JobAgentFactory()
    busy = JobAgentFactory(workspace=idle.workspace)
    _create(idle, "A", 5)
    Job.objects.filter(job_agent=idle).update(
        fair_at=Now() - dt.timedelta(hours=1))  # queued an hour ago, never claimed
    _create(busy, "A", 100)
    assert _drain(busy, 10) == ["A"] * 10
    _create(busy, "B", 40)
    keys = _drain(busy, 20)
    assert 9 <= keys.count("B") <= 10, keys  # one for one (A first on a tie), not B's 40 first


def test_a_job_that_cannot_run_yet_takes_its_place_when_it_can():
    """Delayed, released from hold, retried with a backoff: a fair job's place is no earlier
    than when it can be claimed (so no claim reads past it, and it does not jump the queue
    with a place it took long before)."""
    import datetime as dt

    agent = JobAgentFactory()
    (delayed,) = _create(agent, "A", delay_seconds=3600)
    delayed.refresh_from_db()
    assert delayed.fair_at == delayed.available_at
    (held,) = _create(agent, "B", hold=True)
    Job.objects.filter(id=held.id).update(fair_at=Now() - dt.timedelta(hours=1))
    lifecycle.dispatch_job(held.id, actor="test")
    held.refresh_from_db()
    assert held.status == states.QUEUED
    assert held.fair_at >= held.created_at  # its release's time, not the hour-old place
    (grant,) = lifecycle.claim_next(agent)
    Job.objects.filter(id=grant.job.id).update(max_attempts=5, retry_backoff_seconds=600)
    lifecycle.report_status(grant.job.id, grant.claim_id, states.FAILURE,
                            job_agent_id=agent.id, retry=True)
    retried = Job.objects.get(id=grant.job.id)
    assert retried.status == states.QUEUED and retried.fair_at == retried.available_at


@pytest.mark.postgres_only
def test_a_claim_reads_no_fair_job_that_is_not_due():
    """3,000 fair jobs delayed an hour: a claim of the plain job beside them reads one row."""
    import json

    from jobqueue.lifecycle.pg import claim_statement

    agent = JobAgentFactory()
    _create(agent, "A", 3000, delay_seconds=3600)
    plain = lifecycle.create_job(workspace=agent.workspace, job_agent=agent).job
    with connection.cursor() as cur:
        cur.execute("ANALYZE job")
        cur.execute("BEGIN")
        cur.execute("SET LOCAL enable_seqscan = off")  # a table this small: the index's way
        cur.execute("SET LOCAL enable_sort = off")
        try:
            cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + claim_statement(1), {
                "agent": agent.id, "limit": 1, "lease": 60, "kind": "claimed",
                "actor": "test", "holder": "", "key": None})
            (plan,) = cur.fetchone()
        finally:
            cur.execute("ROLLBACK")
    plan = plan if isinstance(plan, list) else json.loads(plan)

    def nodes(node):
        yield node
        for child in node.get("Plans", ()):
            yield from nodes(child)

    found = list(nodes(plan[0]["Plan"]))
    scan = next((n for n in found if n.get("Index Name") == "job_claim_order_idx"), found)
    assert isinstance(scan, dict), [(n["Node Type"], n.get("Index Name")) for n in scan]
    assert scan["Actual Rows"] == 1 and scan.get("Rows Removed by Filter", 0) == 0
    assert lifecycle.claim_next(agent)[0].job.id == plain.id


def test_priority_outranks_fairness_in_places_too():
    """A key with a low-priority backlog: its high-priority job is placed among the
    high-priority jobs, not after its own backlog."""
    agent = JobAgentFactory()
    _create(agent, "A", 100)
    _create(agent, "C", 100, priority=5)
    (urgent,) = _create(agent, "A", priority=5)
    got = [g.job.id for g in lifecycle.claim_next(agent, limit=10)]
    assert urgent.id in got[:3]


def test_a_plain_job_waits_behind_no_more_than_max_lag_of_fair_jobs(monkeypatch):
    """A key whose places lag the clock (it enqueues slower than a place a STEP): places are
    never more than MAX_LAG behind it, so a plain job is not starved by its later jobs."""
    import datetime as dt

    monkeypatch.setattr(fairness, "MAX_LAG", dt.timedelta(seconds=0))
    agent = JobAgentFactory()
    _create(agent, "A", 5)
    Job.objects.filter(fairness_key="A").update(fair_at=Now() - dt.timedelta(hours=1))
    plain = lifecycle.create_job(workspace=agent.workspace, job_agent=agent).job
    later = _create(agent, "A", 3)
    got = [g.job.id for g in lifecycle.claim_next(agent, limit=20)]
    assert got.index(plain.id) < min(got.index(j.id) for j in later)
