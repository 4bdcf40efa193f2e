"""The one-statement claim and report (PostgreSQL) keep every rule of the ORM path: checked
here by the statements they send, their plans, and real callers racing them. The field and
scope tests run on both backends (SQLite takes the ORM path)."""

import re

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from jobqueue import lifecycle, states
from jobqueue.db import NowPlusSeconds, db_now
from jobqueue.exceptions import ClaimSuperseded, Conflict, NotFound
from jobqueue.models import Job, JobClaim, JobEvent
from tests.factories import JobAgentFactory, JobFactory
from tests.utils import events_of_kind, run_threads, statements_sent, timeline_events

pytestmark = pytest.mark.django_db(transaction=True)


def sent(ctx):
    return [q["sql"] for q in ctx.captured_queries]


@pytest.mark.postgres_only
def test_claim_and_report_are_one_statement_each():
    agent = JobAgentFactory()
    JobFactory.create_batch(3, job_agent=agent)
    with CaptureQueriesContext(connection) as claim:
        grant = lifecycle.claim_next_job(agent)
    with CaptureQueriesContext(connection) as progress:
        lifecycle.report_status(grant.job.id, grant.claim_id, states.IN_PROGRESS, message="half")
    with CaptureQueriesContext(connection) as report:
        lifecycle.report_status(grant.job.id, grant.claim_id, states.SUCCESSFUL,
                                job_agent_id=agent.id)
    with CaptureQueriesContext(connection) as batch:
        grants = lifecycle.claim_next_jobs(agent, 2)
    with CaptureQueriesContext(connection) as named:
        lifecycle.report_status(grants[0].job.id, grants[0].claim_id, states.FAILURE)
    for ctx in (claim, progress, report, batch, named):
        assert len(sent(ctx)) == 1, sent(ctx)  # no BEGIN/COMMIT either: autocommit
    assert len(grants) == 2


@pytest.mark.postgres_only
def test_claim_statement_locks_through_the_partial_index_without_sorting():
    from tests.integration.core.test_races import bulk_jobs

    agent = JobAgentFactory()
    bulk_jobs(agent, 20000, status=states.SUCCESSFUL, completed_at=db_now(), attempt=1)
    bulk_jobs(agent, 20)
    with connection.cursor() as cur:
        cur.execute("ANALYZE job")
    with statements_sent() as sent:
        assert len(lifecycle.claim_next_jobs(agent, 5)) == 5
    ((sql, params),) = sent  # the statement production ran, with its parameters
    with connection.cursor() as cur:
        cur.execute("EXPLAIN " + sql, params)
        plan = "\n".join(row[0] for row in cur.fetchall())
    locking = plan.split("CTE locked", 1)[1].split("CTE claimed", 1)[0]
    assert "job_claim_order_idx" in locking, plan
    assert "LockRows" in locking and "Sort" not in locking, plan
    # LIMIT sits above the row locks, inside a CTE evaluated once (not IN (SELECT ...)).
    assert locking.index("Limit") < locking.index("LockRows"), plan



@pytest.mark.postgres_only
@pytest.mark.parametrize("limit", [1, 10])
def test_a_claim_keeps_one_generic_plan_without_a_sequential_scan(limit):
    """claim-next, and a batch claim of each size, is planned once per connection, not on
    every call (its LIMIT is in the text: with it a parameter, PostgreSQL re-planned the
    statement each time, or, on a small table, kept a generic plan that scanned the whole job
    table)."""
    from jobqueue.lifecycle.pg import LITERAL_LIMITS, claim_statement
    from jobqueue.sql import postgresql
    from tests.integration.core.test_races import bulk_jobs

    agent = JobAgentFactory()
    statement = claim_statement(limit)
    assert f"LIMIT {limit}\n" in statement and "%(limit)s" not in statement
    big = LITERAL_LIMITS + 1  # past them, the parameter (and a plan per call)
    assert claim_statement(big) == postgresql.job_claim_available
    for rows in (200, 3000):
        bulk_jobs(agent, rows, status=states.SUCCESSFUL, completed_at=db_now(), attempt=1)
        bulk_jobs(agent, 12 * limit)
        with connection.cursor() as cur:
            cur.execute("ANALYZE job")
        connection.close()  # a new session: nothing prepared yet
        for _ in range(12):
            assert len(lifecycle.claim_next_jobs(agent, limit)) == limit
        names = re.findall(r"%\((\w+)\)s", statement)
        values = {"agent": agent.id, "lease": 60, "kind": "claimed", "actor": "a",
                  "detail": "{}", "holder": "", "key": None}
        with connection.cursor() as cur:
            cur.execute("SELECT name, generic_plans, custom_plans FROM pg_prepared_statements "
                        "WHERE statement LIKE %s",
                        [f"%LIMIT {limit}\n%FOR NO KEY UPDATE SKIP LOCKED%"])
            ((name, generic, custom),) = cur.fetchall()
            assert custom <= 5 and generic >= 7, (rows, generic, custom)
            cur.execute("SET plan_cache_mode = force_generic_plan")
            try:
                order = list(dict.fromkeys(names))
                cur.execute(f"EXPLAIN EXECUTE {name}({', '.join(['%s'] * len(order))})",
                            [values[n] for n in order])
                plan = "\n".join(row[0] for row in cur.fetchall())
            finally:
                cur.execute("RESET plan_cache_mode")
        if rows > 1000:  # (on a tiny table scanning it is the cheap plan, and is chosen)
            assert "Seq Scan on job " not in plan and "job_pkey" in plan, plan


@pytest.mark.postgres_only
@pytest.mark.parametrize("name", ["job_set_state_if_running", "job_fail_or_retry_if_running",
                                  "job_set_state_if_running_many"])
def test_a_report_deletes_its_claim_rows_by_the_primary_key_in_its_generic_plan(name):
    """A report's generic plan (the one a connection keeps) deletes the claim rows through
    job_claim's primary key, not by scanning the table for their claim_id: job_claim churns
    a row per job, and a plan made while the table was small and unanalysed (a new install,
    after a TRUNCATE) would otherwise scan every page it grows to, on every report."""
    from jobqueue.sql import postgresql

    text = getattr(postgresql, name)
    names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", text)))
    for i, n in enumerate(names):
        text = text.replace(f"%({n})s", f"${i + 1}")
    with connection.cursor() as cur:
        cur.execute("SET plan_cache_mode = force_generic_plan")
        try:
            cur.execute(f"PREPARE report_plan AS {text}")
            cur.execute(f"EXPLAIN EXECUTE report_plan({', '.join(['NULL'] * len(names))})")
            plan = [row[0] for row in cur.fetchall()]
        finally:
            cur.execute("DEALLOCATE report_plan")
            cur.execute("RESET plan_cache_mode")
    # The lines of the `gone` CTE: from its header to the next CTE's (not a "CTE Scan").
    headers = [i for i, line in enumerate(plan) if re.fullmatch(r"\s*CTE \w+", line)]
    start = next(i for i in headers if plan[i].strip() == "CTE gone")
    end = next((i for i in headers if i > start), len(plan))
    deletion = "\n".join(plan[start:end])
    assert "Seq Scan on job_claim" not in deletion and "job_claim_pkey" in deletion, plan


def test_report_sets_fields_and_respects_scope():
    agent = JobAgentFactory()
    other = JobAgentFactory(workspace=agent.workspace)
    job = JobFactory(job_agent=agent)
    grant = lifecycle.claim_job(agent, job.id)
    with pytest.raises(NotFound):
        lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL, job_agent_id=other.id)
    assert Job.objects.get(id=job.id).status == states.IN_PROGRESS
    progress = lifecycle.report_status(job.id, grant.claim_id, states.IN_PROGRESS,
                                       message="50% done", result={"step": 1})
    assert progress.status == states.IN_PROGRESS and progress.message == "50% done"
    assert progress.result == {"step": 1} and progress.completed_at is None
    done = lifecycle.report_status(
        job.id, grant.claim_id, states.SUCCESSFUL, message="ok", result=[1, "two", None],
        external_id="ext-9", job_agent_id=agent.id, workspace_id=agent.workspace_id,
    )
    stored = Job.objects.get(id=job.id)
    for j in (done, stored):
        assert j.status == states.SUCCESSFUL and j.message == "ok" and j.external_id == "ext-9"
        assert j.result == [1, "two", None] and j.completed_at is not None
    assert done.completed_at == stored.completed_at and done.updated_at == stored.updated_at
    assert not JobClaim.objects.filter(job_id=job.id).exists()
    events = timeline_events(job.id)  # the report's is read from the job row
    assert [e.kind for e in events][-3:] == ["claimed", "progress_reported", "status_reported"]
    assert events[-1].detail == {"status": "successful", "has_result": True, "message": "ok"}
    assert events[-1].claim_id == grant.claim_id and events[-1].attempt == 1
    assert events[-1].actor == f"agent:{agent.id}"
    # A retried identical report is a success; another status is refused.
    again = lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL)
    assert again.id == job.id and again.status == states.SUCCESSFUL
    with pytest.raises(Conflict) as refused:
        lifecycle.report_status(job.id, grant.claim_id, states.FAILURE)
    assert refused.value.code == "job_finished"


def test_claim_grant_matches_what_is_stored():
    agent = JobAgentFactory(lease_seconds=45)
    JobFactory.create_batch(3, job_agent=agent, dispatch_context={"secret": "s"})
    grants = lifecycle.claim_next_jobs(agent, 3)
    assert len(grants) == 3
    for grant in grants:
        claim = JobClaim.objects.get(job_id=grant.job.id)
        job = Job.objects.get(id=grant.job.id)
        assert grant.claim_id == claim.claim_id == job.last_claim_id
        assert grant.claim_expires_at == claim.claim_expires_at
        assert grant.claimed_at == claim.claimed_at == job.started_at == grant.server_time
        assert (grant.claim_expires_at - grant.claimed_at).total_seconds() == 45
        assert grant.job.dispatch_context == {"secret": "s"} and grant.job.attempt == 1
        assert grant.heartbeat_interval_seconds == 15
        (event,) = timeline_events(job.id, "claimed")  # the job row says it
        assert event.claim_id == grant.claim_id and event.detail == {"lease_seconds": 45}
        assert "secret" not in str(event.detail)


@pytest.mark.postgres_only
def test_race_reports_against_reapers_exactly_one_wins_each_job():
    """Every claim has just expired; one thread reports each job while two reap. Each job
    ends either reported (no reap event) or reaped (the report refused, claim_superseded),
    never both; nothing deadlocks; in_progress <=> one claim row."""
    agent = JobAgentFactory(max_attempts=5)
    JobFactory.create_batch(80, job_agent=agent)
    grants = lifecycle.claim_next_jobs(agent, 80)
    JobClaim.objects.update(claim_expires_at=NowPlusSeconds(-1))

    def work(i, barrier):
        barrier.wait()
        if i == 0:
            outcomes = {}
            for g in grants:
                try:
                    lifecycle.report_status(g.job.id, g.claim_id, states.SUCCESSFUL,
                                            job_agent_id=agent.id)
                    outcomes[g.job.id] = "reported"
                except ClaimSuperseded:
                    outcomes[g.job.id] = "refused"
            return outcomes
        for _ in range(40):
            lifecycle.reap_expired_claims_once(3)
        return None

    outcomes = run_threads(work, 3)[0]
    lifecycle.reap_expired_claims_once(1000)
    reaped = set(JobEvent.objects.filter(kind="reaped").values_list("job_id", flat=True))
    reported = {e.job_id for e in events_of_kind("status_reported")}
    statuses = dict(Job.objects.values_list("id", "status"))
    assert not JobClaim.objects.exists()
    for g in grants:
        if outcomes[g.job.id] == "reported":
            assert g.job.id in reported and g.job.id not in reaped
            assert statuses[g.job.id] == states.SUCCESSFUL
        else:
            assert g.job.id in reaped and g.job.id not in reported
            assert statuses[g.job.id] == states.QUEUED


@pytest.mark.postgres_only
def test_race_reports_against_cancels_requeues_and_heartbeats():
    """A report, an operator action and batch heartbeats race on every job: exactly one of
    report and operator action takes effect, and the timeline says which."""
    agent = JobAgentFactory()
    JobFactory.create_batch(40, job_agent=agent)
    grants = lifecycle.claim_next_jobs(agent, 40)
    pairs = [(g.job.id, g.claim_id) for g in grants]

    def work(i, barrier):
        barrier.wait()
        won = {}
        for k, g in enumerate(grants):
            try:
                if i == 0:
                    lifecycle.report_status(g.job.id, g.claim_id, states.SUCCESSFUL)
                elif i == 1:
                    (lifecycle.cancel_job if k % 2 else lifecycle.requeue_job)(g.job.id)
                else:
                    lifecycle.heartbeat_many(agent.id, pairs[k:] + pairs[:k])
                    continue
                won[g.job.id] = True
            except Conflict:
                won[g.job.id] = False
        return won

    report_won, operator_won, _ = run_threads(work, 3)
    assert not JobClaim.objects.exists()
    for k, g in enumerate(grants):
        job = Job.objects.get(id=g.job.id)
        kinds = [e.kind for e in timeline_events(g.job.id)]
        if report_won[g.job.id]:
            # The report came first; the operator then acted on a finished job.
            assert kinds.count("status_reported") == 1
            if k % 2:  # cancel of a finished job is refused
                assert job.status == states.SUCCESSFUL and not operator_won[g.job.id]
            else:  # requeue of a finished job is allowed and queues it again
                assert job.status == states.QUEUED and operator_won[g.job.id]
        else:
            assert "status_reported" not in kinds
            assert operator_won[g.job.id]
            assert job.status == (states.CANCELLED if k % 2 else states.QUEUED)


# --- the hot path's own cursor (PostgreSQL) ------------------------------------------------


def _same_as_the_orm(job):
    stored = Job.objects.get(id=job.id)
    for field in Job._meta.concrete_fields:
        mine, theirs = getattr(job, field.attname), getattr(stored, field.attname)
        assert mine == theirs and type(mine) is type(theirs), field.name
        if hasattr(mine, "tzinfo"):
            assert mine.tzinfo == theirs.tzinfo, field.name
    assert job._state.adding is False and job._state.db == stored._state.db


def test_claimed_and_reported_jobs_have_the_orms_values_types_and_time_zones():
    agent = JobAgentFactory()
    JobFactory(job_agent=agent, dispatch_context={"k": [1, 2]}, job_agent_config={"c": "x"})
    grant = lifecycle.claim_next_job(agent)
    _same_as_the_orm(grant.job)
    done = lifecycle.report_status(grant.job.id, grant.claim_id, states.FAILURE,
                                   result={"r": True}, message="m", job_agent_id=agent.id)
    _same_as_the_orm(done)
    assert done.result == {"r": True} and done.completed_at is not None


@pytest.mark.postgres_only
def test_logged_or_not_a_statement_runs_on_the_same_cached_cursor():
    """CaptureQueriesContext (and DEBUG) see what production runs: the same statement text
    on the same cached cursor, through Django's own cursor wrapper and execute_wrapper()s."""
    from jobqueue.lifecycle.pg import claim_statement
    from jobqueue.sql import postgresql

    agent = JobAgentFactory()
    JobFactory.create_batch(3, job_agent=agent)
    with statements_sent() as quiet:
        first = lifecycle.claim_next_job(agent)
    hot = connection.jobqueue_backend.cursor
    raw = hot._cursor

    cursors = []

    def record(execute, sql, params, many, context):
        cursors.append(context["cursor"].cursor)
        return execute(sql, params, many, context)

    with CaptureQueriesContext(connection) as logged, connection.execute_wrapper(record):
        second = lifecycle.claim_next_job(agent)
        lifecycle.report_status(second.job.id, second.claim_id, states.SUCCESSFUL,
                                job_agent_id=agent.id)
    assert quiet == [(claim_statement(1), quiet[0][1])]
    assert [q["sql"] for q in logged.captured_queries] == [
        claim_statement(1), postgresql.job_set_state_if_running]
    assert cursors == [raw, raw] and hot._cursor is raw  # no other cursor, logged or not
    assert first.job.id != second.job.id


@pytest.mark.postgres_only
def test_hot_cursor_follows_a_new_connection():
    agent = JobAgentFactory()
    JobFactory.create_batch(3, job_agent=agent)
    first = lifecycle.claim_next_job(agent)
    connection.close()  # e.g. CONN_MAX_AGE, or the database went away
    second = lifecycle.claim_next_job(agent)
    lifecycle.report_status(first.job.id, first.claim_id, states.SUCCESSFUL)
    connection.close()
    lifecycle.report_status(second.job.id, second.claim_id, states.SUCCESSFUL)
    assert Job.objects.filter(status=states.SUCCESSFUL).count() == 2


@pytest.mark.postgres_only
def test_hot_path_keeps_djangos_error_wrapping_and_broken_transaction_check():
    import psycopg
    from django.db import DataError, OperationalError
    from django.db.transaction import TransactionManagementError

    agent = JobAgentFactory()
    JobFactory.create_batch(2, job_agent=agent)
    lifecycle.claim_next_job(agent)  # the hot cursor exists
    assert not connection.queries_logged  # so the claims below take the hot path
    # A broken transaction refuses the hot statement as it refuses any query.
    with transaction.atomic():
        try:
            with transaction.atomic(savepoint=False), connection.cursor() as bad:
                bad.execute("SELECT 1/0")
        except DataError:
            pass
        with pytest.raises(TransactionManagementError):
            lifecycle.claim_next_job(agent)
    # A server-side failure surfaces as Django's error class, not psycopg's.
    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        (pid,) = cur.fetchone()
    s = connection.settings_dict
    with psycopg.connect(host=s.get("HOST") or "127.0.0.1", port=s.get("PORT") or 5432,
                         user=s.get("USER") or "postgres", dbname=s["NAME"],
                         autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])
    with pytest.raises(OperationalError):
        lifecycle.claim_next_job(agent)
    connection.close()
    assert lifecycle.claim_next_job(agent) is not None  # a new connection, a new cursor


@pytest.mark.postgres_only
def test_a_plain_jobs_writes_meet_flow_controls_triggers_only_through_a_test_of_its_keys():
    """Migration 0033: a row trigger's WHEN is compiled for every statement that sets its
    columns, so flow control keeps one trigger per event whose WHEN only asks whether the row
    carries a key (eleven longer ones cost a plain claim and report ~60 us each); the one on
    concurrency_held is set by the admission only, never by a claim or a report."""
    with connection.cursor() as cur:
        cur.execute("SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger "
                    "WHERE tgrelid = 'job'::regclass AND NOT tgisinternal ORDER BY tgname")
        triggers = dict(cur.fetchall())
    assert sorted(triggers) == ["job_flow_deleted", "job_flow_inserted", "job_flow_mark",
                                "job_flow_moved", "job_flow_slotted"]
    key = r"(old|new)\.(concurrency_key|rate_limit_key|fairness_key) IS NOT NULL"
    for definition in triggers.values():
        when = definition.split(" WHEN ", 1)[1].split(" EXECUTE ", 1)[0]
        tests = when.replace("(", "").replace(")", "").split(" OR ")
        assert all(re.fullmatch(key, test) for test in tests), definition
    assert "UPDATE OF status, available_at ON" in triggers["job_flow_moved"]
    assert "UPDATE OF concurrency_held ON" in triggers["job_flow_slotted"]
