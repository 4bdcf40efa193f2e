"""Every index on `job` names the reader it serves and that reader's benchmark (#26): the
registry is benchmarks/readers.py READERS, whose `readers` scenario times each reader with
and without its index (docs/performance.md, "Who reads each index on job"). An index added
without a reader, or a reader left behind by a dropped index, fails here."""

import pytest
from django.db import connection, transaction

from benchmarks.readers import READERS, Context, indexes_in_plan, plan_indexes
from jobqueue import lifecycle
from jobqueue.models import JobGroup
from tests.factories import JobAgentFactory, JobFactory

pytestmark = [pytest.mark.django_db, pytest.mark.postgres_only]


def test_every_index_on_job_names_its_reader():
    with connection.cursor() as cur:
        cur.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'job'")
        on_table = {name for (name,) in cur.fetchall()}
    named = [r.index for r in READERS]  # an index may serve more than one reader
    assert len({(r.index, r.query) for r in READERS}) == len(READERS)
    assert set(named) == on_table, (
        f"indexes without a reader in benchmarks/readers.py: {sorted(on_table - set(named))}; "
        f"readers of indexes that do not exist: {sorted(set(named) - on_table)}")
    assert all(r.reader for r in READERS)


def _drop(cur, name):
    cur.execute("SELECT 1 FROM pg_constraint WHERE conname = %s", [name])
    if cur.fetchone():
        cur.execute(f'ALTER TABLE job DROP CONSTRAINT "{name}" CASCADE')
    else:
        cur.execute(f'DROP INDEX "{name}"')


class _Undo(Exception):
    pass


def test_each_readers_query_can_be_served_by_its_index_alone():
    """Each reader's query, as the code builds it, with every other index on `job` dropped
    (but those it names as read beside it) in a savepoint rolled back, and sequential scans
    off, reads its index: the index's columns and predicate fit the query. Which index the
    planner prefers at size is the `readers` benchmark's to show; on a table this small it
    would not say."""
    agent = JobAgentFactory()
    small = JobAgentFactory(workspace=agent.workspace)
    job = JobFactory(job_agent=agent, external_id="ext-1", idempotency_key="key-1", group="g",
                     unique_key="u-1")
    JobGroup.objects.create(workspace=agent.workspace, name="g")
    ctx = Context(workspace_id=agent.workspace_id, agent_id=agent.id, small_agent_id=small.id,
                  job_id=job.id, external_id="ext-1", idempotency_key="key-1", group="g",
                  unique_key="u-1",
                  label_set_id=lifecycle.create_job(workspace=agent.workspace,
                                                    labels=["gpu"]).job.label_set_id)
    with connection.cursor() as cur:  # the factories' deferred checks, before ALTER TABLE
        cur.execute("SET CONSTRAINTS ALL IMMEDIATE")
    for r in READERS:
        try:
            with transaction.atomic(), connection.cursor() as cur:
                for name in {other.index for other in READERS} - {r.index, *r.also}:
                    _drop(cur, name)
                cur.execute("SET LOCAL enable_seqscan = off")
                qs = r.query(ctx)
                list(qs)
                assert r.index in plan_indexes(qs), (r.index, qs.explain())
                raise _Undo
        except _Undo:
            pass


def test_the_plan_walk_finds_nested_index_names():
    plan = [{"Plan": {"Node Type": "Limit", "Plans": [
        {"Node Type": "Index Scan", "Index Name": "a"},
        {"Node Type": "Bitmap Heap Scan", "Plans": [{"Index Name": "b"}]}]}}]
    assert indexes_in_plan(plan) == {"a", "b"}
    assert indexes_in_plan([{"Plan": {"Node Type": "Seq Scan"}}]) == set()


def test_a_job_on_the_hot_path_writes_entries_in_four_indexes():
    """What a claim and a report cost in index entries (#26 item 4, docs/performance.md, "What
    a job costs the database"): neither is a HOT update (each changes `status`), so each new
    version of the row enters every index whose predicate it meets. A plain job's claim
    (status in_progress) meets only the full indexes; its report those and
    job_finished_idx. job_agent_id has no index of its own (migration 0036): an agent's
    readers use job_workspace_status_idx, which ends with it. An index added here costs
    every job an entry at each transition: it needs a predicate, or a reader worth it."""
    with connection.cursor() as cur:
        cur.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'job'")
        defs = dict(cur.fetchall())
    full = {name for name, text in defs.items() if " WHERE " not in text}
    assert full == {"job_pkey", "job_workspace_created_idx", "job_workspace_status_idx"}
    assert defs["job_workspace_status_idx"].endswith("(workspace_id, status, job_agent_id)")
    assert not [text for text in defs.values() if text.endswith("(job_agent_id)")]
