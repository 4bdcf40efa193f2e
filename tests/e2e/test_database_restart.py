"""Acceptance scenario 6: PostgreSQL restarted in immediate mode under load.

The server restarted is a private cluster that this test starts for itself (tests/e2e/
pgcluster.py: initdb on a temporary directory, a free port), never the machine's shared
PostgreSQL: the test database pytest-django made stays where it is, and this test points its
Django connection, the API server, the agents and the reapers at the private cluster."""

import time

import pytest
from django.core.management import call_command
from django.db import connection

from jobqueue import states
from jobqueue.models import Job, JobClaim

from .harness import Stack, audit, duplicated_executions, wait_for
from .pgcluster import PrivateCluster

pytestmark = [pytest.mark.e2e, pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def private_postgres(transactional_db):
    """A private cluster with the schema migrated, and this process's default connection
    pointed at it for the test (restored, with its own connection, afterwards)."""
    cluster = PrivateCluster().start()
    saved = dict(connection.settings_dict)
    try:
        cluster.create_database("jobqueue_restart")
        connection.close()
        connection.settings_dict.update(HOST=cluster.host, PORT=cluster.port,
                                        NAME="jobqueue_restart", USER=cluster.user,
                                        PASSWORD="")
        call_command("migrate", verbosity=0, interactive=False)
        yield cluster
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(saved)
        cluster.stop()


@pytest.fixture
def stack(private_postgres, tmp_path):
    """The conftest's stack, on the private cluster."""
    with Stack(tmp_path) as s:
        yield s


def restart_postgres(cluster: PrivateCluster) -> None:
    cluster.restart_immediate()
    wait_for(cluster.is_ready, 90, "PostgreSQL to come back", interval=0.2,
             on_fail=cluster.server_log)
    connection.close()  # this test's own connection died with the server


def test_postgres_restart_under_load_loses_nothing(private_postgres, stack, make_agent, make_jobs,
                                                   say):
    agent, token = make_agent(lease_seconds=4, max_attempts=10)
    jobs = make_jobs(agent, 100, stack.command("sleep 0.2"))
    ids = [j.id for j in jobs]
    stack.start_reaper(interval=0.5)
    agents = [stack.start_agent(agent, token, name, concurrency=n)
              for name, n in (("A", 1), ("B", 2), ("C", 3))]

    def finished():
        return Job.objects.filter(id__in=ids, status__in=states.TERMINAL).count()

    wait_for(lambda: finished() >= 20, 60, "work to be under way", on_fail=stack.logs)
    t0 = time.monotonic()
    restart_postgres(private_postgres)
    restart_took = time.monotonic() - t0
    assert finished() < len(ids), "the restart should hit a queue with work left"

    wait_for(lambda: finished() == len(ids), 120, "every job to end after the restart",
             on_fail=stack.logs)
    recovered_in = time.monotonic() - t0 - restart_took
    report = audit(ids)
    assert report["violations"] == []
    assert report["terminal_not_once"] == {}
    assert report["statuses"] == {states.SUCCESSFUL: len(ids)}
    for job in Job.objects.filter(id__in=ids):
        assert job.result["attempt"] == job.attempt  # the accepted result is the current claim's
    assert not JobClaim.objects.filter(job_id__in=ids).exists()
    dups = duplicated_executions(stack, ids)
    say(f"postgres restart took {restart_took:.1f}s, the rest of the work {recovered_in:.1f}s;"
          f" {len(ids)} jobs, {len(stack.starts())} executions, "
          f"{dups} duplicated, events {dict(report['kinds'])}")
    # Server, reaper and agents reconnected on their own: all still running, all stop cleanly.
    assert stack.server.alive()
    assert [a.stop() for a in agents] == [0, 0, 0]


@pytest.fixture
def waiting_stack(private_postgres, tmp_path):
    """The stack on the private cluster, with the server's safety re-check pushed out to a
    minute: a wake-up within seconds can only come from the listener."""
    with Stack(tmp_path, server_env={"JOBQUEUE_WAIT_RECHECK_SECONDS": 60}) as s:
        yield s


def test_the_listener_survives_a_postgres_restart_and_waiters_still_wake(
        private_postgres, waiting_stack, make_agent, make_jobs, say):
    stack = waiting_stack
    stack.start_server(workers=1, threads=16)
    agent, token = make_agent(lease_seconds=10)
    a = stack.start_agent(agent, token, "A", idle_max=5)  # long-polls (wait 50 s)
    time.sleep(2)  # its claim is held
    restart_postgres(private_postgres)
    time.sleep(8)  # the listener's reconnect backoff is at most 5 s
    created = time.monotonic()
    [job] = make_jobs(agent, 1, stack.command("true"))
    wait_for(lambda: stack.starts(), 10, "the job to start", interval=0.02, on_fail=stack.logs)
    took = time.monotonic() - created
    say(f"pickup after a PostgreSQL restart: {took * 1000:.0f} ms")
    assert took < 1.5  # the held wait (or the next one) was woken by NOTIFY
    wait_for(lambda: Job.objects.get(id=job.id).status == states.SUCCESSFUL, 30, "success",
             on_fail=stack.logs)
    assert a.stop() == 0
