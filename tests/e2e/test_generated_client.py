"""A client generated from the published schema by a third-party generator runs a whole job.

`manage.py spectacular` exports the schema, `openapi-python-client` (pinned in
requirements-dev.txt) generates a package from it with the command docs/api.md gives
("Generated clients"), and that package, imported as is, drives a real server (gunicorn): the
producer (workspace API key) creates a job agent, its token and a job; the agent claims the next
job, heartbeats and reports it successful; the producer reads the job back as successful. The
model names must read as the API does (HeartbeatRequest, never HeartbeatRequestRequest), and the
generator may skip nothing but the one body it does not support (the log's text/plain).
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import uuid
from http import HTTPStatus
from pathlib import Path

import pytest
import yaml

from agents import credentials
from jobqueue.models import Workspace

from .harness import ROOT

pytestmark = pytest.mark.e2e

GENERATOR = str(Path(sys.executable).with_name("openapi-python-client"))
PACKAGE = "jobqueue_generated"
# What the generator may report: it cannot send the log append's text/plain body, so it
# skips that alternative (its append_log sends application/octet-stream, which the server
# takes the same). Any other warning or error fails the test.
KNOWN_WARNINGS = {
    "WARNING parsing PATCH /v1/workspaces/{workspace_id}/jobs/{job_id}/log within agent.",
    "Unsupported content type text/plain",
}


def run(argv, env, what):
    out = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"{what} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}"
    return out


def reported_problems(stderr: str) -> set[str]:
    """The lines of the warnings and errors the generator printed (headers and details; its
    banner, its closing line and the schema excerpts left out)."""
    return {line for line in stderr.splitlines()
            if line.strip() and not line.startswith((" ", "{", "}"))
            and not line.startswith(("Warning(s) encountered", "Error(s) encountered",
                                     "If you believe this was a mistake"))}


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """The generated package (once per module), imported from a temporary directory and
    forgotten afterwards. The schema needs no database; the generator needs no server."""
    tmp = tmp_path_factory.mktemp("generated-client")
    schema = tmp / "schema.yaml"
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBQUEUE_")}
    env.update(DJANGO_SETTINGS_MODULE="config.settings", PYTHONPATH=str(ROOT),
               # The generator formats its output with ruff (post hooks), from this virtualenv.
               PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]))
    run([sys.executable, "manage.py", "spectacular", "--file", str(schema)], env,
        "manage.py spectacular")
    target = tmp / PACKAGE
    out = run([GENERATOR, "generate", "--path", str(schema), "--output-path", str(target),
               "--meta", "none"], env, "openapi-python-client generate")
    assert reported_problems(out.stderr) <= KNOWN_WARNINGS, out.stderr
    assert (target / "__init__.py").is_file(), out.stdout + out.stderr

    # Nothing was dropped: one module per operation of the schema.
    doc = yaml.safe_load(schema.read_text())
    operations = {op["operationId"] for item in doc["paths"].values()
                  for method, op in item.items()
                  if method in ("get", "put", "post", "patch", "delete")}
    modules = {p.stem for p in (target / "api").glob("*/*.py") if p.stem != "__init__"}
    assert modules == operations

    sys.path.insert(0, str(tmp))
    try:
        yield importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(tmp))
        for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
            del sys.modules[name]


def test_generated_client_model_names_read_as_the_api_does(generated):
    models = importlib.import_module(f"{PACKAGE}.models")
    names = set(models.__all__)
    assert not [n for n in names if n.endswith("RequestRequest")]
    assert {"HeartbeatRequest", "HeartbeatResponse", "ClaimNextRequest", "ClaimResponse",
            "BatchClaimResponse", "BatchHeartbeatRequest", "BatchReportRequest",
            "StatusReportRequest", "ReleaseRequest", "JobCreateRequest", "Job", "JobDetail",
            "ClaimedJob", "JobAgent", "JobAgentCreateRequest", "JobAgentConfig",
            "DispatchContext", "Error"} <= names
    # One model per free-form object, not one per shape that holds it.
    assert not [n for n in names if n.endswith(("JobAgentConfig", "DispatchContext"))
                and n not in ("JobAgentConfig", "DispatchContext")]


def op(tag: str, name: str):
    """A generated operation module: api/<tag>/<operationId>.py."""
    return importlib.import_module(f"{PACKAGE}.api.{tag}.{name}")


def ok(response, status: HTTPStatus):
    assert response.status_code == status, (response.status_code, response.content)
    return response.parsed


@pytest.mark.django_db(transaction=True)
def test_generated_client_runs_a_whole_job(generated, stack):
    models = importlib.import_module(f"{PACKAGE}.models")
    producer_ops, agent_ops = "producer_and_operator", "agent"
    workspace = Workspace.objects.create(name="generated-client")
    ws = workspace.id
    producer = generated.AuthenticatedClient(
        base_url=stack.url, token=credentials.issue_workspace_api_key(workspace),
        auth_header_name="X-API-Key", prefix="", raise_on_unexpected_status=True)
    agent = None
    try:
        # The producer (workspace API key): a job agent, its token, a job.
        job_agent = ok(op(producer_ops, "create_job_agent").sync_detailed(
            ws, client=producer,
            body=models.JobAgentCreateRequest(name="generated", lease_seconds=30)),
            HTTPStatus.CREATED)
        assert isinstance(job_agent, models.JobAgent) and job_agent.lease_seconds == 30
        issued = ok(op(producer_ops, "issue_agent_token").sync_detailed(
            ws, job_agent.id, client=producer,
            body=models.AgentTokenCreateRequest(name="generated")), HTTPStatus.CREATED)
        created = ok(op(producer_ops, "create_job").sync_detailed(
            ws, client=producer, idempotency_key=str(uuid.uuid4()),
            body=models.JobCreateRequest(
                job_agent_id=job_agent.id,
                job_agent_config=models.JobAgentConfig.from_dict({"command": ["true"]}),
                dispatch_context=models.DispatchContext.from_dict({"secret": "s3"}),
                priority=5)), HTTPStatus.CREATED)
        assert isinstance(created, models.JobCreated)  # the job and `deduplicated`
        assert created.status == models.JobStatusEnum.QUEUED and created.deduplicated is False

        # The agent (its bearer token): claim the next job, heartbeat, report it successful.
        agent = generated.AuthenticatedClient(base_url=stack.url, token=issued.token,
                                              raise_on_unexpected_status=True)
        claim = ok(op(agent_ops, "claim_next_job").sync_detailed(
            ws, job_agent.id, client=agent, body=models.ClaimNextRequest(wait_seconds=5)),
            HTTPStatus.OK)
        assert isinstance(claim, models.ClaimResponse)
        assert claim.job.id == created.id and claim.claim.attempt == 1
        assert claim.job.job_agent_config.to_dict() == {"command": ["true"]}
        assert claim.job.dispatch_context.to_dict() == {"secret": "s3"}

        beat = ok(op(agent_ops, "heartbeat").sync_detailed(
            ws, created.id, client=agent,
            body=models.HeartbeatRequest(claim_id=claim.claim.claim_id)), HTTPStatus.OK)
        assert isinstance(beat, models.HeartbeatResponse) and beat.job_id == created.id
        assert beat.claim_expires_at >= claim.claim.claim_expires_at

        reported = ok(op(agent_ops, "report_status").sync_detailed(
            ws, created.id, client=agent, body=models.StatusReportRequest(
                claim_id=claim.claim.claim_id, status=models.ReportedStatusEnum.SUCCESSFUL,
                message="done", result={"exit_code": 0})), HTTPStatus.OK)
        assert reported.status == models.JobStatusEnum.SUCCESSFUL

        # The claim ended with its job: the typed 409 a stale write gets; nothing to claim.
        stale = ok(op(agent_ops, "heartbeat").sync_detailed(
            ws, created.id, client=agent,
            body=models.HeartbeatRequest(claim_id=claim.claim.claim_id)), HTTPStatus.CONFLICT)
        assert isinstance(stale, models.Error) and stale.code == "job_finished"
        assert op(agent_ops, "claim_next_job").sync_detailed(
            ws, job_agent.id, client=agent, body=models.ClaimNextRequest(wait_seconds=0),
        ).status_code == HTTPStatus.NO_CONTENT

        # The producer reads it back.
        job = ok(op(producer_ops, "get_job").sync_detailed(ws, created.id, client=producer),
                 HTTPStatus.OK)
    finally:
        for client in (producer, agent):
            if client is not None:
                client.get_httpx_client().close()
    assert isinstance(job, models.JobDetail)
    assert job.status == models.JobStatusEnum.SUCCESSFUL
    assert (job.message, job.result, job.attempt) == ("done", {"exit_code": 0}, 1)
    assert job.dispatch_context_keys == ["secret"] and job.claim is None
    assert [(a.number, a.outcome) for a in job.attempts] == [(1, models.OutcomeEnum.SUCCESSFUL)]
