"""Routing labelled jobs (#28 item 1) in the core: the claim of an agent with labels reads
each matching source in claim order from its own index, so the queued jobs it does not match
cost it nothing (its plan, by EXPLAIN ANALYZE on PostgreSQL); racing claims take each job
once; the PostgreSQL statement and the rule (claimrule.matches, which SQLite's claims and the
wake-up hub use) agree on who matches what; the wake-up hub wakes the matching waiters only."""

from __future__ import annotations

import json

import pytest
from django.db import connection

from jobqueue import claimrule, lifecycle, states, wakeups
from jobqueue.models import Job, JobAgent
from tests.factories import WorkspaceFactory
from tests.utils import run_threads

pytestmark = pytest.mark.django_db(transaction=True)


def _unmatched(ws, n):
    """n queued jobs waiting for `windows`, which no agent has (in SQL: setup only)."""
    windows = lifecycle.label_set(ws.id, ["windows"])
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO job (id, workspace_id, labels, label_set_id, status, job_agent_config, "
            "dispatch_context, message, external_id, attempt, max_attempts, "
            "initial_max_attempts, priority, available_at, idempotency_fingerprint, "
            "created_at, updated_at) "
            "SELECT gen_random_uuid(), %s, '[\"windows\"]', %s, 'queued', '{}', '{}', '', '', "
            "0, 3, 3, i %% 5 + 10, now() - interval '1 hour', '', now(), now() "
            "FROM generate_series(1, %s) i", [ws.id, windows.id, n])
        cur.execute("ANALYZE job")


def _plan(agent, limit):
    from jobqueue.lifecycle.pg import claim_statement

    params = {"agent": agent.id, "limit": limit, "lease": 60, "kind": "claimed",
              "actor": "test", "holder": "", "key": None}
    with connection.cursor() as cur:
        cur.execute("BEGIN")
        try:
            cur.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
                        + claim_statement(limit, True), params)
            (plan,) = cur.fetchone()
        finally:
            cur.execute("ROLLBACK")
    return plan if isinstance(plan, list) else json.loads(plan)


def _nodes(node):
    yield node
    for child in node.get("Plans", ()):
        yield from _nodes(child)


@pytest.mark.postgres_only
@pytest.mark.parametrize("limit", [1, 10])
def test_a_claim_reads_no_job_it_does_not_match(limit):
    ws = WorkspaceFactory()
    agent = lifecycle.create_job_agent(workspace=ws, name="fleet", labels=["gpu", "linux"])
    for i in range(12):
        lifecycle.create_job(workspace=ws, labels=["gpu"] if i % 2 else ["linux", "gpu"])
        lifecycle.create_job(workspace=ws, job_agent=agent)
    _unmatched(ws, 3_000)
    before = _plan(agent, limit)
    _unmatched(ws, 27_000)
    after = _plan(agent, limit)
    nodes = list(_nodes(after[0]["Plan"]))
    scans = {(n["Node Type"], n.get("Index Name")) for n in nodes if "Relation Name" in n
             and n["Relation Name"] == "job"}
    # Each label set's jobs in claim order from its index (its own jobs from an index on
    # job_agent); never a scan of the job table.
    assert ("Index Scan", "job_label_claim_order_idx") in scans, scans
    assert not any(kind == "Seq Scan" or "Bitmap" in kind for kind, _ in scans), scans
    # The labelled rows it reads: at most `limit` a set it matches (two), beside 30,000 it
    # does not match.
    read = sum(n.get("Actual Rows", 0) * n.get("Actual Loops", 1) for n in nodes
               if n.get("Index Name") == "job_label_claim_order_idx")
    assert 0 < read <= 2 * limit, read

    def label_buffers(plan):  # the pages its scans of the label sets read (index and heap)
        return sum(n.get("Shared Hit Blocks", 0) + n.get("Shared Read Blocks", 0)
                   for n in _nodes(plan[0]["Plan"])
                   if n.get("Index Name") == "job_label_claim_order_idx")

    # Ten times the unmatched jobs, the same pages (but for an index level more a set: the
    # unmatched jobs share the index with the ones it matches).
    assert 0 < label_buffers(after) <= label_buffers(before) + 2, (label_buffers(before),
                                                                   label_buffers(after))


@pytest.mark.postgres_only
def test_racing_agents_with_labels_take_each_job_once():
    ws = WorkspaceFactory()
    agents = [lifecycle.create_job_agent(workspace=ws, name=f"a{i}", labels=["gpu", f"n{i}"])
              for i in range(8)]
    ids = {lifecycle.create_job(workspace=ws, labels=["gpu"]).job.id for _ in range(300)}
    ids |= {lifecycle.create_job(workspace=ws, labels=["gpu", "n0"]).job.id for _ in range(30)}

    def worker(i, barrier):
        me = JobAgent.objects.get(id=agents[i].id)
        barrier.wait()
        got = []
        while True:
            grants = lifecycle.claim_next_jobs(me, 1 + i % 3)
            if not grants:
                return got
            got.extend((g.job.id, g.job.labels) for g in grants)

    results = run_threads(worker, len(agents))
    taken = [job for got in results for job, _labels in got]
    assert len(taken) == len(set(taken)) and set(taken) == ids
    # the jobs only a0 matches went to a0
    assert all(labels == ["gpu"] for got in results[1:] for _job, labels in got)
    assert Job.objects.filter(id__in=ids, status=states.IN_PROGRESS).count() == len(ids)


@pytest.mark.parametrize("agent_labels, job_labels, matched", [
    (["gpu", "linux"], ["gpu"], True),
    (["gpu", "linux"], ["gpu", "linux"], True),
    (["gpu"], ["gpu", "linux"], False),
    (["linux"], ["gpu"], False),
    (["region=eu", "a/b", "x:y"], ["x:y", "region=eu"], True),
    (["GPU"], ["gpu"], False),  # case-sensitive
    ([], ["gpu"], False),
])
def test_the_statement_and_the_rule_agree_on_who_matches(agent_labels, job_labels, matched):
    ws = WorkspaceFactory()
    agent = lifecycle.create_job_agent(workspace=ws, name="a", labels=agent_labels)
    job = lifecycle.create_job(workspace=ws, labels=job_labels).job
    assert claimrule.matches(agent.labels, job.labels) is matched
    assert (agent in claimrule.agents_matching(job)) is matched
    listed = Job.objects.filter(claimrule.routed_to(agent)).claimable()
    assert list(listed.values_list("id", flat=True)) == ([job.id] if matched else [])
    assert (claimrule.agents_with_claimable_jobs([agent.id]) == [agent.id]) is matched
    # the claim itself (PostgreSQL: its statement; SQLite: the ORM's)
    grant = lifecycle.claim_next_job(agent)
    assert (grant is not None and grant.job.id == job.id) is matched


def test_the_hub_wakes_a_matching_waiter_of_the_workspace_only():
    hub = wakeups.Hub()
    hub._ensure_thread = lambda: None  # no listener: deliver() by hand
    gpu = hub.register("a:gpu", route=("ws1", frozenset({"gpu", "linux"})))
    cpu = hub.register("a:cpu", route=("ws1", frozenset({"linux"})))
    elsewhere = hub.register("a:far", route=("ws2", frozenset({"gpu", "linux"})))
    plain = hub.register("a:plain")
    hub.deliver("l:ws1:gpu,linux")
    assert gpu.event.is_set()
    assert not (cpu.event.is_set() or elsewhere.event.is_set() or plain.event.is_set())
    gpu.event.clear()
    hub.deliver("l:ws1:linux")  # one job: one of the two matching waiters
    assert [gpu.event.is_set(), cpu.event.is_set()].count(True) == 1
    assert not elsewhere.event.is_set()
    key = wakeups.route_key(Job(workspace_id="ws1", labels=["gpu"], label_set_id=1))
    assert key == "l:ws1:gpu"
    for waiter in (gpu, cpu, elsewhere, plain):
        hub.unregister(waiter)


def _open_claim(agent):
    """The agent's claim statement run on a connection of its own, its transaction left
    open (its row locks held): (the connection, the ids it claimed)."""
    import psycopg

    from jobqueue.lifecycle.pg import claim_statement

    d = connection.settings_dict
    other = psycopg.connect(f"dbname={d['NAME']} user={d['USER']} host={d['HOST']} "
                            f"port={d['PORT']}")
    rows = other.execute(claim_statement(1, True), {
        "agent": agent.id, "limit": 1, "lease": 60,
        "kind": "claimed", "actor": f"agent:{agent.id}", "holder": "", "key": None}).fetchall()
    return other, [row[0] for row in rows]


@pytest.mark.postgres_only
def test_a_claim_racing_one_that_holds_its_rows_takes_the_next_ones():
    """Two agents of one label set: while one's claim holds the rows it read (its statement's
    transaction open), the other's claim takes the next ones, as claim-next of one agent's
    own jobs does (SKIP LOCKED as it reads each source)."""
    ws = WorkspaceFactory()
    x = lifecycle.create_job_agent(workspace=ws, name="x", labels=["gpu", "linux"])
    y = lifecycle.create_job_agent(workspace=ws, name="y", labels=["gpu"])
    jobs = [lifecycle.create_job(workspace=ws, labels=["gpu"], priority=9 - i).job
            for i in range(3)]
    other, taken = _open_claim(x)
    try:
        assert taken == [jobs[0].id]
        assert [g.job.id for g in lifecycle.claim_next_jobs(y, 1)] == [jobs[1].id]
        assert lifecycle.claim_job(y, jobs[2].id).job.id == jobs[2].id
    finally:
        other.rollback()
        other.close()


@pytest.mark.postgres_only
def test_a_claim_reads_only_the_label_sets_within_its_labels():
    """20,000 label sets of the workspace that the agent does not match (a label each, as
    `run=<id>`), and 20,000 of another workspace with its labels, are never read: the sets
    are found through their GIN index, its elements qualified by the workspace."""
    ws = WorkspaceFactory()
    elsewhere = WorkspaceFactory()
    agent = lifecycle.create_job_agent(workspace=ws, name="fleet", labels=["gpu", "linux"])
    lifecycle.create_job(workspace=ws, labels=["gpu"])
    lifecycle.create_job(workspace=ws, labels=["linux", "gpu"])
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO job_label_set (workspace_id, labels, key, created_at) "
            "SELECT %s, jsonb_build_array('run=' || i), 'run=' || i, now() "
            "FROM generate_series(1, 20000) i", [ws.id])
        cur.execute(
            "INSERT INTO job_label_set (workspace_id, labels, key, created_at) "
            "SELECT %s, jsonb_build_array('gpu', 'host=' || i), 'gpu,host=' || i, now() "
            "FROM generate_series(1, 20000) i", [elsewhere.id])
        cur.execute("ANALYZE job_label_set")
    plan = _plan(agent, 1)
    sets = [n for n in _nodes(plan[0]["Plan"]) if n.get("Relation Name") == "job_label_set"
            or n.get("Index Name") == "job_label_set_labels_gin"]
    assert any(n.get("Index Name") == "job_label_set_labels_gin" for n in sets), sets
    assert not any(n["Node Type"] == "Seq Scan" for n in sets), sets
    assert max(n.get("Actual Rows", 0) for n in sets) <= 2, sets
    assert len(lifecycle.claim_next_jobs(agent, 5)) == 2
