"""Fixtures for the acceptance suite (marked `e2e`): real server, agent and reaper processes
on the test database. Jobs and agents are set up through the ORM (the producer side is not what
is under test here); everything the agents do goes over real HTTP."""

import json

import pytest

from agents import credentials
from jobqueue import lifecycle
from jobqueue.models import JobAgent, Workspace

from .harness import Stack


@pytest.fixture
def stack(transactional_db, tmp_path):
    with Stack(tmp_path) as s:
        yield s


@pytest.fixture
def out_stack(transactional_db, tmp_path):
    """A stack whose server keeps artifacts under tmp_path/artifacts (jobs' outputs)."""
    store = tmp_path / "artifacts"
    with Stack(tmp_path, server_env={
        "JOBQUEUE_ARTIFACT_STORAGE_OPTIONS": json.dumps({"location": str(store)}),
    }) as s:
        yield s


@pytest.fixture
def make_agent(transactional_db):
    """A job agent with a short lease (set directly: below the API's usual minimum; the
    server runs with JOBQUEUE_MIN_LEASE_SECONDS=1) and a fresh token."""

    def make(lease_seconds=2, max_attempts=3, name="e2e"):
        workspace = Workspace.objects.create(name=f"ws-{name}")
        agent = JobAgent.objects.create(workspace=workspace, name=name,
                                        lease_seconds=lease_seconds, max_attempts=max_attempts)
        return agent, credentials.issue_agent_token(agent, name="e2e")

    return make


@pytest.fixture
def make_jobs():
    def make(agent, n, command, *, timeout_seconds=None, dispatch_context=None,
             max_attempts=None, priority=0):
        config = {"command": command}
        if timeout_seconds is not None:
            config["timeout_seconds"] = timeout_seconds
        jobs = []
        for _ in range(n):
            job, _ = lifecycle.create_job(
                workspace=agent.workspace, job_agent=agent, job_agent_config=config,
                dispatch_context=dispatch_context or {"n": len(jobs)},
                max_attempts=max_attempts, priority=priority,
            )
            jobs.append(job)
        return jobs

    return make


@pytest.fixture
def say(capsys):
    """Print past pytest's capture: the numbers a run measured show in every run's output."""

    def say(message):
        with capsys.disabled():
            print(f"\n[e2e] {message}", flush=True)

    return say
