"""The hot statements' PL/pgSQL wrappers (jobqueue/lifecycle/pg/functions.py): `migrate`
installs one per statement, generated from its text; an unprepared connection (behind a
transaction-mode PgBouncer) calls them and gets what the statements answer; one whose
wrapper is missing or of another text runs the statement itself; `migrate` defines again a
wrapper whose definition would differ."""

import pytest
from django.core.management import call_command
from django.db import connection

from jobqueue import lifecycle, sql, states
from jobqueue.lifecycle.pg import claim_statement, functions
from jobqueue.models import JobClaim, JobEvent
from tests.factories import JobAgentFactory, JobFactory
from tests.utils import statements_sent, timeline_events

from .test_sql import _cycle

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]


def _installed():
    with connection.cursor() as cursor:
        return functions.installed(cursor, functions.wrapped())


@pytest.fixture
def unprepared(settings):
    """This thread's connection as a pooled deployment runs it (a new one, unprepared)."""
    settings.JOBQUEUE = {**settings.JOBQUEUE, "PREPARED_STATEMENTS": False}
    connection.close()
    yield
    connection.close()


def test_migrate_installs_a_wrapper_of_each_hot_statement_and_then_nothing_more():
    wrapped = functions.wrapped()
    assert set(wrapped.values()) >= {claim_statement(1), sql.postgresql.job_claim_by_id,
                                     sql.postgresql.job_set_state_if_running,
                                     sql.postgresql.job_set_state_if_running_many}
    assert set(_installed()) == set(wrapped)
    assert functions.install(connection) == []  # all there, as this code defines them


def test_a_wrapper_takes_the_statements_parameters_and_answers_its_columns():
    statement = sql.postgresql.job_set_state_if_running
    name = functions.name_of("job_set_state_if_running", statement)
    assert functions.call(name, statement).startswith(
        f"SELECT * FROM {name}(%(status)s, %(message)s, %(result)s, %(external_id)s, "
        "%(job)s, ")
    with connection.cursor() as cursor:
        create, _digest = functions.definition(cursor, name, statement)
    assert create.startswith(f"CREATE FUNCTION {name}(p_status character varying, "
                             "p_message text, p_result jsonb, ")
    assert '"claims_deleted" bigint' in create
    assert "%(" not in create and "WHERE job.id = $5 AND" in create


def test_an_unprepared_connection_calls_the_wrappers_and_gets_the_same_answers(unprepared):
    agent = JobAgentFactory()
    JobFactory.create_batch(3, job_agent=agent)
    calls = {functions.call(name, text): text for name, text in functions.wrapped().items()}
    with statements_sent() as sent:
        grant = lifecycle.claim_next_job(agent, holder="h1")
        lifecycle.heartbeat(grant.job.id, grant.claim_id, job_agent_id=agent.id)
        done = lifecycle.report_status(grant.job.id, grant.claim_id, states.SUCCESSFUL,
                                       message="ok", result={"n": 1}, job_agent_id=agent.id)
    texts = [text for text, _ in sent]
    assert texts[0] == sql.postgresql.function_list_installed  # once, for the connection
    ran = [calls[t] for t in texts if t in calls]
    assert ran == [claim_statement(1), sql.postgresql.claim_extend_if_current,
                   sql.postgresql.job_set_state_if_running]
    assert texts.count(sql.postgresql.function_list_installed) == 1
    assert grant.job.status == states.IN_PROGRESS and grant.attempt == 1
    assert grant.claim_expires_at > grant.claimed_at
    assert (done.status, done.message, done.result) == (states.SUCCESSFUL, "ok", {"n": 1})
    assert not JobClaim.objects.filter(job_id=grant.job.id).exists()
    kinds = [(e.kind, e.holder) for e in timeline_events(grant.job.id)]
    assert kinds[-2:] == [(JobEvent.CLAIMED, "h1"), (JobEvent.STATUS_REPORTED, "")]
    with connection.cursor() as cursor:  # nothing prepared: plans live in the functions
        cursor.execute("SELECT count(*) FROM pg_prepared_statements")
        assert cursor.fetchone()[0] == 0


def test_every_hand_run_path_works_unprepared_through_the_wrappers(unprepared):
    """The whole hand-run cycle of test_sql (claims of every kind, heartbeats, effects,
    reports of every kind), unprepared: every statement with a wrapper ran as its call."""
    calls = {functions.call(name, text) for name, text in functions.wrapped().items()}
    with statements_sent() as sent:
        _cycle(JobAgentFactory())
    texts = {text for text, _ in sent}
    assert calls <= texts
    assert not texts & set(functions.wrapped().values())


def test_a_connection_without_the_wrapper_of_its_text_runs_the_statement(unprepared):
    """An upgrade not migrated yet: the server has no wrapper of the text this code runs."""
    report = functions.name_of("job_set_state_if_running",
                               sql.postgresql.job_set_state_if_running)
    with connection.cursor() as cursor:
        cursor.execute(sql.postgresql.function_drop.format(function=report))
    connection.close()
    try:
        agent = JobAgentFactory()
        JobFactory(job_agent=agent)
        with statements_sent() as sent:
            grant = lifecycle.claim_next_job(agent)
            done = lifecycle.report_status(grant.job.id, grant.claim_id, states.SUCCESSFUL)
        texts = [text for text, _ in sent]
        assert sql.postgresql.job_set_state_if_running in texts
        assert claim_statement(1) not in texts  # its wrapper is there
        assert done.status == states.SUCCESSFUL
    finally:
        assert functions.install(connection) == [report]


def test_migrate_defines_again_a_wrapper_whose_definition_differs():
    """A wrapper made with other types (a column's type changed since) is defined again by
    the next `migrate` (its post_migrate receiver), the others left alone."""
    heartbeat = functions.name_of("claim_extend_if_current",
                                  sql.postgresql.claim_extend_if_current)
    with connection.cursor() as cursor:
        cursor.execute(sql.postgresql.function_drop.format(function=heartbeat))
        cursor.execute(f"CREATE FUNCTION {heartbeat}() RETURNS TABLE (x integer) "
                       "LANGUAGE plpgsql AS $$ /* jobqueue wrapper 0 */ BEGIN END $$")
    assert _installed()[heartbeat] == "0"
    with statements_sent() as sent:
        call_command("migrate", verbosity=0)
    drops = [t for t, _ in sent if t.startswith("DROP FUNCTION")]
    assert drops == [sql.postgresql.function_drop.format(function=heartbeat)]
    assert _installed()[heartbeat] != "0"
    agent = JobAgentFactory()
    JobFactory(job_agent=agent)
    grant = lifecycle.claim_next_job(agent)
    assert lifecycle.heartbeat(grant.job.id, grant.claim_id, job_agent_id=agent.id)


def test_the_migrations_reverse_drops_every_wrapper_and_migrate_installs_them_again():
    from django.db.migrations.loader import MigrationLoader

    (installing,) = [m for (app, name), m in MigrationLoader(connection).disk_migrations.items()
                     if app == "jobqueue" and name.endswith("_pgbouncer_statement_functions")]
    ((_app, before),) = installing.dependencies
    call_command("migrate", "jobqueue", before, verbosity=0)
    try:
        assert _installed() == {}
    finally:
        call_command("migrate", verbosity=0)
    assert set(_installed()) == set(functions.wrapped())


def test_a_statement_the_server_cannot_describe_gets_no_wrapper_and_fails_no_migrate(
        monkeypatch, caplog):
    """A `migrate` stopped before the migration that adds a column a statement names: that
    statement gets no wrapper (it runs unwrapped), the others are still looked at."""
    bad = {"jobqueue_nope_00000000": "SELECT no_such_column FROM job WHERE id = %(job)s"}
    every = {**bad, **functions.wrapped()}
    monkeypatch.setattr(functions, "wrapped", lambda: every)
    with caplog.at_level("WARNING", logger=functions.__name__):
        assert functions.install(connection) == []
    assert "jobqueue_nope_00000000 not installed" in caplog.text
    assert "no_such_column" in caplog.text
    assert "jobqueue_nope_00000000" not in _installed()
