"""The hand-written SQL (jobqueue/sql/*.sql): every named statement is used, no other SQL is
written or run by hand, each one EXPLAINs on its database, and what a statement must say the
same as Python (the job's columns, the wake-up channel, SQLite's time format) does."""

import ast
import re
import uuid
from pathlib import Path

import pytest
from django.db import connection

from jobqueue import claimrule, lifecycle, sql, states, wakeups
from jobqueue.db import SQLITE_DATETIME_FORMAT, db_now
from jobqueue.lifecycle import concurrency, effects, ratelimits
from jobqueue.lifecycle.backends import backend
from jobqueue.models import Job
from tests.factories import JobAgentFactory, JobFactory
from tests.utils import statements_sent, timeline_events

ROOT = Path(__file__).resolve().parents[3]
SERVICE = ("jobqueue", "agents", "ops", "config")
SQL_START = re.compile(r"^\s*(SELECT\s|INSERT INTO\s|UPDATE \w+ SET\s|DELETE FROM\s|"
                       r"WITH \w+ AS\s|LISTEN \w+\s*$|NOTIFY\s|LOCK TABLE\s|TRUNCATE\s|"
                       r"SET \w+ (=|TO)\s|AND \(?\w+(\.\w+)? (=|IS|<|>|IN)\s|\), \w+ AS \()")


def _service_sources():
    for package in SERVICE:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" not in path.parts:
                yield path


def test_every_named_statement_is_used_by_the_service():
    """Each file's names, where its statements are run: `sql.NAME` in its backend's modules
    (the module imports the file as `sql`), `postgresql.NAME` / `sqlite.NAME` elsewhere."""
    def code(*paths):
        return "\n".join(p.read_text() for p in _service_sources()
                         if any(str(p).startswith(str(ROOT / x)) for x in paths))

    pg = code("jobqueue/lifecycle/pg") + re.sub(r"\bsql\.", "-", code(*SERVICE))
    lite = code("jobqueue/lifecycle/sqlite.py") + re.sub(r"\bsql\.", "-", code(*SERVICE))
    for queries, text in ((sql.postgresql, pg), (sql.sqlite, lite)):
        unused = [name for name in queries.names()
                  if not re.search(rf"\b(sql|{queries.vendor})\.{name}\b", text)]
        assert unused == [], f"unused in jobqueue/sql/{queries.vendor}.sql: {unused}"


def test_no_sql_is_written_in_python():
    """A string constant that starts like a statement (docstrings aside) is SQL written
    outside the files: it belongs in jobqueue/sql/*.sql under a name."""
    found = []
    for path in _service_sources():
        tree = ast.parse(path.read_text())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef)
                      and node.body and isinstance(node.body[0], ast.Expr)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and id(node) not in docstrings and SQL_START.match(node.value)):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


def _cycle(agent):
    """Every hand-run path once: creates with a unique key, claims (next, batch, keyed,
    named), heartbeats (single, batch, with a checkpoint), an effect begun and committed,
    reports (progress, final, retry, batch), a group, a dependency cancelled by an operator,
    wake-ups and the clock."""
    ws = agent.workspace
    jobs = [lifecycle.create_job(workspace=ws, job_agent=agent, dispatch_context={"n": i},
                                 group=f"g{i % 2}")[0].id
            for i in range(6)]
    for _ in range(2):  # a keyed create under its lock, then one that meets it
        lifecycle.create_job(workspace=ws, job_agent=agent, unique_key="nightly", hold=True)
    lifecycle.claim_job(agent, jobs[0])
    first = lifecycle.claim_next_job(agent)
    batch = lifecycle.claim_next_jobs(agent, 2, idempotency_key="k1")
    big = lifecycle.claim_next_jobs(agent, 40)
    lifecycle.heartbeat(first.job.id, first.claim_id, job_agent_id=agent.id,
                        checkpoint={"step": 1})
    lifecycle.heartbeat(first.job.id, first.claim_id, workspace_id=ws.id)
    refs = [lifecycle.ClaimRef(g.job.id, g.claim_id) for g in batch]
    lifecycle.heartbeat_many(agent.id, refs)
    lifecycle.heartbeat_many(agent.id, refs, workspace_id=ws.id)
    effects.begin_effect(first.job.id, first.claim_id, "charge", job_agent_id=agent.id)
    effects.commit_effect(first.job.id, first.claim_id, "charge", 1, workspace_id=ws.id)
    lifecycle.report_status(first.job.id, first.claim_id, states.IN_PROGRESS, message="half",
                            checkpoint={"step": 2})
    lifecycle.report_status(first.job.id, first.claim_id, states.FAILURE, retry=True)
    lifecycle.report_many(agent.id, [
        lifecycle.ReportItem(g.job.id, g.claim_id, states.SUCCESSFUL) for g in batch + big[1:]])
    lifecycle.report_status(big[0].job.id, big[0].claim_id, states.SUCCESSFUL)
    lifecycle.wait_for_job_end(jobs[0], 0)
    # A job with a dependent, ended by an operator: its dependents settled by name.
    parent = lifecycle.create_job(workspace=ws, job_agent=agent)[0]
    lifecycle.create_job(workspace=ws, job_agent=agent, depends_on=[parent.id])
    lifecycle.cancel_job(parent.id)
    # And one ended by its report: the report statement settles it (its child queued).
    parent = lifecycle.create_job(workspace=ws, job_agent=agent)[0]
    child = lifecycle.create_job(workspace=ws, job_agent=agent, depends_on=[parent.id])[0]
    done = lifecycle.claim_job(agent, parent.id)
    lifecycle.report_status(parent.id, done.claim_id, states.SUCCESSFUL)
    child.refresh_from_db()
    assert child.status == states.QUEUED
    # A concurrency key's slots given out by the hub's and the reaper's settle.
    lifecycle.create_job(workspace=ws, job_agent=agent, concurrency_key="k")
    concurrency.settle_key(ws.id, "k")
    concurrency.settle_held_keys()
    # A rate limit key's permits given out by setting its limit, the hub's and the sweep's.
    ratelimits.set_limit(ws.id, "r", 1, 3600)
    for _ in range(2):
        lifecycle.create_job(workspace=ws, job_agent=agent, rate_limit_key="r")
    ratelimits.settle_key(ws.id, "r")
    ratelimits.settle_held_keys()
    # A labelled job, claimed by an agent with labels (its own statement).
    labelled = lifecycle.create_job_agent(workspace=ws, name="gpu-1", labels=["gpu"])
    job = lifecycle.create_job(workspace=ws, labels=["gpu"])[0]
    assert lifecycle.claim_next_job(labelled).job.id == job.id
    assert Job.objects.filter(claimrule.routed_to(labelled)).count() == 1  # its sets
    db_now()
    backend().ping()


@pytest.mark.django_db(transaction=True)
def test_every_statement_run_by_hand_is_a_named_one():
    """What the lifecycle sends that the ORM did not write (the ORM quotes every name) is a
    statement of the database's file, as written there (a batch claim's size written into
    its LIMIT on PostgreSQL)."""
    named = set(dict(sql.queries(connection.vendor)).values())
    if connection.vendor == "postgresql":
        from jobqueue.lifecycle.pg import claim_statement

        named |= {claim_statement(n, routed) for n in range(1, 41) for routed in (0, 1)}
    agent = JobAgentFactory()
    with statements_sent() as sent:
        _cycle(agent)
    by_hand = [text for text, _ in sent if '"' not in text  # transaction control aside
               and not re.match(r"(BEGIN|COMMIT|ROLLBACK|SAVEPOINT|RELEASE)\b", text)]
    assert [text for text in by_hand if text not in named] == []
    if connection.vendor == "postgresql":  # and it ran every one (LISTEN is the hub's; the
        # wrappers' are the migrations' and an unprepared connection's: test_statement_functions)
        texts = {claim_statement(1): "job_claim_available",
                 claim_statement(1, True): "job_claim_available_routed", **{
            t: n for n, t in sql.postgresql}}
        ran = {texts.get(t) for t in by_hand}
        assert set(sql.postgresql.names()) - ran == {"wake_listen", *WRAPPERS_OWN}


# The statements that make, find and call the hot statements' wrappers
# (jobqueue/lifecycle/pg/functions.py), and which of them are templates (filled in there).
WRAPPERS_OWN = {"function_define", "function_call", "function_drop", "function_list_all",
                "function_list_installed", "function_type_names"}
TEMPLATES = {"function_define", "function_call", "function_drop"}


SAMPLES = {  # a value of each parameter's type (EXPLAIN plans, it does not run)
    "agent": uuid.uuid4(), "job": uuid.uuid4(), "claim": uuid.uuid4(), "workspace": None,
    "limit": 3, "labels": "[\"gpu\"]", "lease": 60, "kind": "claimed",
    "actor": "agent:x", "detail": "{}",
    "holder": "", "key": None, "expected": None, "lock": "jobqueue.claim:x:y",
    "status": "successful", "message": None, "result": None, "external_id": None,
    "backoff": 5, "backoff_cap": 3600, "jitter": 0.1, "jobs": [uuid.uuid4()],
    "claims": [uuid.uuid4()], "statuses": ["successful"], "messages": None, "results": None,
    "external_ids": None, "retries": None, "message_chars": 200, "data": "{}",
    "name": "g", "channel": "jobqueue_test", "payloads": ["x"], "pairs": "[]",
    "names": ["jobqueue_x"], "oids": [25], "mods": [-1],
}


@pytest.mark.django_db
def test_every_statement_explains_on_its_database():
    queries = sql.queries(connection.vendor)
    explain = "EXPLAIN" if connection.vendor == "postgresql" else "EXPLAIN QUERY PLAN"
    explained = []
    for name, text in queries:
        if text.startswith("LISTEN"):  # a utility statement: run below, on its own connection
            continue
        if connection.vendor == "postgresql" and name in TEMPLATES:  # filled in, then run
            continue  # (test_statement_functions)
        names = set(re.findall(r"%\((\w+)\)s", text))
        assert names <= set(SAMPLES), f"{name}: no sample for {names - set(SAMPLES)}"
        params = {n: SAMPLES[n] for n in names}
        if connection.vendor == "sqlite":
            params = {n: v.hex if isinstance(v, uuid.UUID) else v for n, v in params.items()}
        with connection.cursor() as cursor:
            cursor.execute(f"{explain} {text}", params)
            assert cursor.fetchall(), name
        explained.append(name)
    listens = [n for n, t in queries if t.startswith("LISTEN")]
    templates = TEMPLATES if connection.vendor == "postgresql" else set()
    assert sorted(explained + listens + sorted(templates)) == sorted(queries.names())


@pytest.mark.postgres_only
@pytest.mark.django_db
def test_the_listen_statement_runs_and_names_the_channel_notify_uses():
    import psycopg

    d = connection.settings_dict
    with psycopg.connect(dbname=d["NAME"], user=d.get("USER") or "postgres",
                         host=d.get("HOST") or "127.0.0.1", port=d.get("PORT") or 5432,
                         autocommit=True) as conn:
        conn.execute(sql.postgresql.wake_listen)
        channels = [r[0] for r in conn.execute("SELECT pg_listening_channels()")]
    assert channels == [wakeups.CHANNEL]
    for name, text in sql.postgresql:
        for channel in re.findall(r"pg_notify\('(\w+)'", text):
            assert channel == wakeups.CHANNEL, name


def test_every_returning_list_names_every_job_column():
    """A statement answers whole jobs by naming their columns (never job.*, which a prepared
    statement cannot survive a migration with): a column added to Job must be added here."""
    columns = {f.column for f in Job._meta.concrete_fields}
    lists = 0
    for name, text in sql.postgresql:
        for found in re.findall(r"RETURNING (job\.id, job\.workspace_id,.*?)\n\)", text, re.S):
            named = {c.strip().removeprefix("job.") for c in found.split(",")}
            assert named == columns, (name, named ^ columns)
            lists += 1
    assert lists == 6


def test_sqlite_statements_write_the_time_as_django_stores_it():
    fmt = SQLITE_DATETIME_FORMAT.replace("%", "%%")
    for name, text in sql.sqlite:
        for found in re.findall(r"STRFTIME\('([^']*)'", text):
            assert found == fmt, name


@pytest.mark.django_db
def test_a_batch_event_keeps_as_much_of_the_message_as_a_single_one():
    from jobqueue.models import JobEvent
    from jobqueue.timeline import MESSAGE_CHARS

    agent = JobAgentFactory()
    JobFactory.create_batch(2, job_agent=agent)
    one, two = lifecycle.claim_next_jobs(agent, 2)
    long = "m" * (MESSAGE_CHARS + 50)
    lifecycle.report_status(one.job.id, one.claim_id, states.FAILURE, message=long)
    lifecycle.report_many(agent.id, [lifecycle.ReportItem(two.job.id, two.claim_id,
                                                          states.FAILURE, message=long)])
    # The single report (no agent named: stored) and the batch's (the agent's own: read from
    # the job row, jobqueue/timeline.py) say the same.
    kept = [e.detail["message"] for job in (one.job, two.job)
            for e in timeline_events(job.id, JobEvent.STATUS_REPORTED)]
    assert kept == [long[:MESSAGE_CHARS]] * 2
    assert JobEvent.objects.filter(kind=JobEvent.STATUS_REPORTED).count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_checkpoint_is_saved_only_under_the_current_claim_in_its_scope():
    """The backend's save_checkpoint (each database's own statement or reads) writes only
    while the claim is current and in the caller's scope; otherwise it answers False and
    writes nothing."""
    from django.db import transaction

    from jobqueue.lifecycle.checkpoints import checkpoints_for, save_checkpoint

    agent, other = JobAgentFactory(), JobAgentFactory()
    job = JobFactory(job_agent=agent)
    grant = lifecycle.claim_job(agent, job.id)
    with transaction.atomic():
        assert not save_checkpoint(job.id, uuid.uuid4(), '{"n": 0}')
        assert not save_checkpoint(job.id, grant.claim_id, '{"n": 0}', job_agent_id=other.id)
        assert not save_checkpoint(job.id, grant.claim_id, '{"n": 0}',
                                   workspace_id=other.workspace_id)
    assert checkpoints_for([job.id]) == {}
    with transaction.atomic():
        assert save_checkpoint(job.id, grant.claim_id, '{"n": 1}', job_agent_id=agent.id,
                               workspace_id=agent.workspace_id)
    assert checkpoints_for([job.id]) == {job.id: {"n": 1}}
