"""Acceptance scenario 6: PostgreSQL restarted in immediate mode under load.

This restarts the shared PostgreSQL server once (a few seconds), and waits until it is back."""

import os
import subprocess
import time

import pytest
from django.db import connection

from jobqueue import states
from jobqueue.models import Job, JobClaim

from .harness import audit, duplicated_executions, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]


def postgres_is_ready() -> bool:
    d = connection.settings_dict
    return subprocess.run(
        ["pg_isready", "-q", "-h", d.get("HOST") or "127.0.0.1", "-p", str(d.get("PORT") or 5432)],
        timeout=10,
    ).returncode == 0


def restart_postgres() -> None:
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    out = subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart",
         "-m", "immediate"],
        capture_output=True, text=True, timeout=120,
    )
    # Whatever pg_ctlcluster said, wait for the server to accept connections again.
    wait_for(postgres_is_ready, 90, f"PostgreSQL to come back ({out.stderr.strip()})",
             interval=0.2)
    connection.close()  # this test's own connection died with the server


def test_postgres_restart_under_load_loses_nothing(stack, make_agent, make_jobs, say):
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
    restart_postgres()
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
