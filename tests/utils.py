"""Helpers for tests that use real threads and processes."""

import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from django.db import connection, connections

ROOT = Path(__file__).resolve().parent.parent


def subprocess_database_url() -> str:
    """A DATABASE_URL naming the database this test runs against (the test database)."""
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    user = s.get("USER") or "postgres"
    password = f":{s['PASSWORD']}" if s.get("PASSWORD") else ""
    host = s.get("HOST") or "127.0.0.1"
    port = s.get("PORT") or 5432
    return f"postgres://{user}{password}@{host}:{port}/{s['NAME']}"


def subprocess_env(**extra) -> dict:
    env = dict(os.environ)
    env["DATABASE_URL"] = subprocess_database_url()
    env["DJANGO_SETTINGS_MODULE"] = "config.settings"
    env["PYTHONPATH"] = str(ROOT)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def spawn(*args, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def run_threads(target, n: int, *args, timeout: float = 300) -> list:
    """Run target(i, barrier, *args) in n threads started together; return their results.

    Every thread is joined within `timeout` seconds (in all): one still running then (a
    deadlock, a lost wake-up) fails the test, as does an exception raised in any thread
    (the first one is re-raised). Each thread closes its own database connection."""
    barrier = threading.Barrier(n)
    results: list = [None] * n
    errors: list = []

    def wrap(i):
        try:
            results[i] = target(i, barrier, *args)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
            errors.append(exc)
            barrier.abort()
        finally:
            connections.close_all()

    threads = [threading.Thread(target=wrap, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    stuck = [i for i, t in enumerate(threads) if t.is_alive()]
    if stuck:
        barrier.abort()
        raise AssertionError(f"thread(s) {stuck} of {n} still running after {timeout} s")
    if errors:
        raise errors[0]
    return results


@contextmanager
def statements_sent(conn=None):
    """The (sql, params) of every statement sent on `conn` (default: this thread's) inside
    the block, as production sends them: recorded by an execute_wrapper(), which every
    cursor path runs, the lifecycle's hot cursor included."""
    conn = conn or connection
    sent: list = []

    def record(execute, sql, params, many, context):
        sent.append((sql, params))
        return execute(sql, params, many, context)

    with conn.execute_wrapper(record):
        yield sent


def final_state_is_consistent():
    """Invariant 2 (docs/architecture.md, "Invariants"; jobqueue/states.py): in_progress <=>
    exactly one claim row; claims only on in_progress jobs."""
    from jobqueue import states
    from jobqueue.models import Job, JobClaim

    in_progress = set(Job.objects.filter(status=states.IN_PROGRESS).values_list("id", flat=True))
    claimed = list(JobClaim.objects.values_list("job_id", flat=True))
    assert len(claimed) == len(set(claimed))
    assert set(claimed) == in_progress


# --- waiting on the event a test means (issue #27) -------------------------------------------


def wait_for(predicate, timeout: float = 30, what: str = "a condition", interval: float = 0.01,
             on_fail=None):
    """Poll `predicate()` until it answers something truthy, and return that answer; fail
    the test (AssertionError naming `what`, then what `on_fail()` returns, e.g. a process's
    logs) if it has not within `timeout` seconds.

    For a test that waits on the event it means (a database row, a log line, a registered
    waiter) instead of sleeping: the timeout is a bound on a hang, not a timing claim, so
    make it generous; the wait ends as soon as the event has happened. The acceptance suite
    polls its processes less often (tests/e2e/harness.py, interval 0.1 s)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            extra = f"\n{on_fail()}" if on_fail else ""
            raise AssertionError(f"gave up waiting {timeout} s for {what}{extra}")
        time.sleep(interval)


def database_now():
    """The database's clock now (CURRENT_TIMESTAMP), e.g. before starting a server."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT CURRENT_TIMESTAMP")
        return cursor.fetchone()[0]


def wake_listeners(since) -> int:
    """PostgreSQL: the wake-up listeners LISTENing on this database that connected at or
    after `since` (pg_stat_activity, application_name jobqueue.wakeups.LISTENER_NAME). A
    server process starts its listener when its first waiter registers, so one listening
    says a wait is held there and that a NOTIFY from now on reaches it."""
    from jobqueue import wakeups

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                       "AND datname = current_database() AND backend_start >= %s "
                       "AND query ILIKE 'LISTEN%%'", [wakeups.LISTENER_NAME, since])
        return cursor.fetchone()[0]


def wait_until_claim_held(job_agent_id, since, timeout: float = 30) -> None:
    """Wait until a server started at or after `since` (database_now()) holds a claim of
    the agent, on the events that say so: the agent seen (last_seen_at, written when its
    request is authenticated) and, on PostgreSQL, the wake-up listener of the server process
    that registered the waiter. (SQLite's listener reads a file: nothing outside the process
    shows it; there only the first holds.) For a server's first held claim of the agent."""
    from jobqueue.models import JobAgent

    wait_for(lambda: JobAgent.objects.filter(id=job_agent_id, last_seen_at__isnull=False)
             .exists(), timeout, "the held claim to reach the server")
    if connection.vendor == "postgresql":
        wait_for(lambda: wake_listeners(since), timeout, "the server's wake-up listener")


def timeline_events(job_id, kind: str | None = None) -> list:
    """The job's timeline as readers see it (jobqueue/timeline.py): its stored events and
    the agent's final report read from the job row, oldest first; of `kind` if given."""
    from jobqueue import timeline
    from jobqueue.models import Job

    events = timeline.events(Job.objects.get(id=job_id), 100_000)
    return [e for e in events if kind is None or e.kind == kind]


def events_of_kind(kind: str, **job_filters) -> list:
    """Every event of `kind` on the timelines of the jobs matching `job_filters` (all jobs:
    none), stored or read from the job row."""
    from jobqueue.models import Job

    return [e for job_id in Job.objects.filter(**job_filters).values_list("id", flat=True)
            for e in timeline_events(job_id, kind)]
