"""Fixtures for the HTTP API tests: credentials made through agents.credentials, and one
`Caller` shape over both the in-process client and a real HTTP connection (live server)."""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
import pytest
from django.test import Client

from agents import credentials
from jobqueue import lifecycle
from jobqueue.lifecycle.schedules import create_schedule
from tests.factories import JobAgentFactory, JobFactory, WorkspaceFactory

_open_callers: list = []


class Caller:
    """get/post/put/delete(path, json=..., headers=...) -> response with .status_code,
    .json(), .headers; paths are relative to /v1/workspaces/{workspace_id}/ unless they
    start with '/'."""

    def __init__(self, workspace_id, headers, base_url=None):
        self.workspace_id = workspace_id
        self.headers = dict(headers)
        self.base_url = base_url
        self._http = httpx.Client(base_url=base_url, timeout=30) if base_url else None
        if self._http is not None:
            _open_callers.append(self)
        self._client = None if base_url else Client()

    def path(self, path: str) -> str:
        return path if path.startswith("/") else f"/v1/workspaces/{self.workspace_id}/{path}"

    def request(self, method, path, json_body=None, headers=None, raw=None, content_type=None):
        hdrs = {**self.headers, **(headers or {})}
        body = raw if raw is not None else (None if json_body is None else json.dumps(json_body))
        ctype = content_type or "application/json"
        if self._http is not None:
            if body is not None:
                hdrs.setdefault("Content-Type", ctype)
            return self._http.request(method, self.path(path), content=body, headers=hdrs)
        kwargs = {"headers": hdrs}
        if body is not None:
            kwargs.update(data=body, content_type=ctype)
        return self._client.generic(method, self.path(path), **kwargs)

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post(self, path, json=None, **kw):
        return self.request("POST", path, json_body=json, **kw)

    def put(self, path, json=None, **kw):
        return self.request("PUT", path, json_body=json, **kw)

    def delete(self, path, **kw):
        return self.request("DELETE", path, **kw)

    def with_headers(self, headers):
        return Caller(self.workspace_id, headers, self.base_url)

    def close(self):
        if self._http is not None:
            self._http.close()


@dataclass
class World:
    workspace: object
    key: str
    agent: object
    token: str
    other_agent: object
    other_token: str
    other_workspace: object
    other_key: str
    other_workspace_agent: object
    base_url: str | None = None

    def producer(self) -> Caller:
        return Caller(self.workspace.id, {"X-API-Key": self.key}, self.base_url)

    def agent_caller(self, token=None) -> Caller:
        return Caller(
            self.workspace.id, {"Authorization": f"Bearer {token or self.token}"}, self.base_url
        )

    def anonymous(self) -> Caller:
        return Caller(self.workspace.id, {}, self.base_url)


def make_world(base_url=None) -> World:
    ws, ws2 = WorkspaceFactory(), WorkspaceFactory()
    agent = JobAgentFactory(workspace=ws, lease_seconds=30)
    other = JobAgentFactory(workspace=ws, lease_seconds=30)
    foreign = JobAgentFactory(workspace=ws2)
    return World(
        workspace=ws,
        key=credentials.issue_workspace_api_key(ws),
        agent=agent,
        token=credentials.issue_agent_token(agent),
        other_agent=other,
        other_token=credentials.issue_agent_token(other),
        other_workspace=ws2,
        other_key=credentials.issue_workspace_api_key(ws2),
        other_workspace_agent=foreign,
        base_url=base_url,
    )


@contextmanager
def artifact_server(tmp_path, max_artifact_bytes: int, *, threads: int):
    """A real gunicorn (one worker) whose artifacts go to `tmp_path/artifacts` (`.store`)."""
    from tests.e2e.harness import Stack

    store = tmp_path / "artifacts"
    stack = Stack(tmp_path, server_env={
        "JOBQUEUE_ARTIFACT_STORAGE_OPTIONS": json.dumps({"location": str(store)}),
        "JOBQUEUE_MAX_ARTIFACT_BYTES": max_artifact_bytes,
    })
    stack.store = store
    try:
        stack.start_server(workers=1, threads=threads)
        yield stack
    finally:
        stack.close()


@pytest.fixture(autouse=True)
def _close_callers():
    yield
    # Close keep-alive connections, so the live server's request threads (and their
    # database connections) end before the test database is dropped.
    while _open_callers:
        _open_callers.pop().close()


@pytest.fixture
def world(db):
    """In-process client (full Django + DRF stack, no socket)."""
    return make_world()


@pytest.fixture
def live_world(live_server, transactional_db):
    """A real HTTP connection to a live server thread (its own DB connections)."""
    return make_world(base_url=live_server.url)


@pytest.fixture
def target(world):
    """A claimed job, a grouped job, a schedule, and the ids of a request that reaches them:
    the path's and the body's (test_no_echo, test_strict_bodies)."""
    job = JobFactory(job_agent=world.agent)
    grant = lifecycle.claim_job(world.agent, job.id)
    lifecycle.create_job(workspace=world.workspace, job_agent=world.agent, group="run-x")
    schedule = create_schedule(workspace=world.workspace, name="nightly", cron_expr="30 2 * * *",
                               job_agent=world.agent, job={})
    return {
        "path": {"workspace_id": world.workspace.id, "agent_id": world.agent.id,
                 "job_id": job.id, "group": "run-x", "key": "charge-card",
                 "schedule_id": schedule.id},
        "ids": {"claim_id": str(grant.claim_id), "job_id": str(job.id),
                "job_agent_id": str(world.agent.id)},
    }
