"""The served OpenAPI schema: it validates, the docs page uses local assets, and
schemathesis, driven against a live server, finds no 5xx and no response off the schema."""

import os

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from jobqueue import lifecycle
from jobqueue.lifecycle import schedules
from tests.factories import JobFactory

from .conftest import make_world

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("wakeups_stopped_after")]

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
# Per operation; the whole run stays well under a minute. Raise it for a deeper local run:
# API_SCHEMA_EXAMPLES=200 pytest tests/integration/api/test_schema.py
EXAMPLES = int(os.environ.get("API_SCHEMA_EXAMPLES", "12"))


@pytest.fixture
def api_target(live_server, transactional_db, settings):
    # Held requests (wait_seconds) end within a second here: a longer one is a 400.
    settings.JOBQUEUE = {**settings.JOBQUEUE, "MAX_CLAIM_WAIT_SECONDS": 1}
    world = make_world(base_url=live_server.url)
    job = JobFactory(job_agent=world.agent, dispatch_context={"secret": "hidden"})
    lifecycle.create_job(workspace=world.workspace, job_agent=world.agent, group="run-1")
    schedule = schedules.create_schedule(workspace=world.workspace, name="nightly",
                                         cron_expr="30 2 * * *", job_agent=world.agent, job={})
    return {
        "world": world,
        "paths": {
            "workspace_id": str(world.workspace.id),
            "agent_id": str(world.agent.id),
            "job_id": str(job.id),
            "group": "run-1",
            "schedule_id": str(schedule.id),
        },
    }


def _drive(live_server, api_target, mode, checks):
    schema = schemathesis.openapi.from_url(f"{live_server.url}/v1/schema/")
    headers = {"X-API-Key": api_target["world"].key}
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 20
    for operation in operations:
        if mode == GenerationMode.NEGATIVE and not takes_input(operation):
            continue  # GET /v1/version, the JWKS: nothing a request could get wrong

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        def check(case):
            # Aim at real objects, so requests get past 404 into validation and lifecycle.
            for name, value in api_target["paths"].items():
                if name in (case.path_parameters or {}):
                    case.path_parameters[name] = value
            if isinstance(case.body, dict) and "job_agent_id" in case.body:
                case.body["job_agent_id"] = api_target["paths"]["agent_id"]
            job = case.body.get("job") if isinstance(case.body, dict) else None
            if isinstance(job, dict) and "job_agent_id" in job:  # a schedule's job
                job["job_agent_id"] = api_target["paths"]["agent_id"]
            if isinstance(case.body, dict) and isinstance(case.body.get("jobs"), list):
                for job in case.body["jobs"]:  # a flow's jobs (POST flows)
                    if isinstance(job, dict) and "job_agent_id" in job:
                        job["job_agent_id"] = api_target["paths"]["agent_id"]
            case.call_and_validate(headers=headers, checks=checks)

        check()


def takes_input(operation) -> bool:
    return any(len(params) for params in (operation.path_parameters, operation.query,
                                          operation.headers, operation.cookies)) \
        or bool(operation.body)


def test_api_conforms_to_its_schema(live_server, api_target):
    """Every operation of the served schema, EXAMPLES valid requests each (the schemathesis
    pytest plugin's lazy fixture loader does not run on pytest 9, so the operations are
    driven here with Hypothesis directly)."""
    _drive(live_server, api_target, GenerationMode.POSITIVE, CHECKS)


def test_invalid_requests_never_get_a_server_error(live_server, api_target):
    """Requests that break the schema (wrong types, missing fields, bad values): each is
    answered with a documented 4xx, never a 5xx."""
    _drive(live_server, api_target, GenerationMode.NEGATIVE,
           [not_a_server_error, status_code_conformance, content_type_conformance,
            response_schema_conformance])


def test_schema_is_served_and_names_every_endpoint(live_world):
    import httpx

    r = httpx.get(f"{live_world.base_url}/v1/schema/?format=json")
    assert r.status_code == 200
    doc = r.json()
    assert doc["openapi"].startswith("3.")
    paths = set(doc["paths"])
    base = "/v1/workspaces/{workspace_id}/"
    for path in [
        "job-agents/{agent_id}/jobs", "job-agents/{agent_id}/jobs/{job_id}/claim",
        "job-agents/{agent_id}/jobs/claim", "jobs/{job_id}/heartbeat", "jobs/{job_id}/status",
        "jobs/{job_id}/release", "jobs", "jobs/{job_id}", "jobs/{job_id}/cancel",
        "jobs/{job_id}/requeue", "jobs/{job_id}/dispatch", "job-agents",
        "job-agents/{agent_id}", "job-agents/{agent_id}/tokens",
        "job-agents/{agent_id}/tokens/{token_id}", "groups/{group}", "groups/{group}/cancel",
        "jobs/{job_id}/claims/{claim_id}", "webhooks", "webhooks/{webhook_id}",
        "webhooks/{webhook_id}/deliveries", "jobs/{job_id}/log",
        "jobs/{job_id}/artifacts", "jobs/{job_id}/artifacts/{name}",
        "job-agents/{agent_id}/pause", "job-agents/{agent_id}/resume", "flows",
        "jobs/{job_id}/effects", "jobs/{job_id}/effects/{key}",
        "jobs/{job_id}/effects/{key}/begin", "schedules", "schedules/{schedule_id}",
        "schedules/{schedule_id}/trigger", "jobs/{job_id}/explain",
        "registration-tokens", "registration-tokens/{token_id}",
        "job-agents/{agent_id}/tokens/rotate", "rate-limits", "rate-limits/{key}",
        "fairness-keys", "fairness-keys/{key}",
    ]:
        assert base + path in paths, path
    assert "/v1/register" in paths
    assert "patch" in doc["paths"][base + "job-agents/{agent_id}"]
    assert set(doc["paths"][base + "rate-limits/{key}"]) >= {"get", "put", "delete"}
    assert set(doc["paths"][base + "fairness-keys/{key}"]) >= {"get", "put", "delete"}
    # The public version (no credential needed; tests/integration/ops/test_versions.py) and
    # the fencing tokens' key set (tests/integration/api/test_fencing.py).
    assert "/v1/version" in paths
    assert "/v1/.well-known/jwks.json" in paths
    claim_info = doc["components"]["schemas"]["ClaimInfo"]
    assert "fencing_token" in claim_info["required"]
    assert claim_info["properties"]["fencing_token"]["type"] == "string"
    schemes = doc["components"]["securitySchemes"]
    assert schemes["workspaceApiKey"]["name"] == "X-API-Key"
    assert schemes["agentToken"]["scheme"] == "bearer"


def test_swagger_ui_is_served_from_local_static_files(live_world, settings):
    import httpx

    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }
    page = httpx.get(f"{live_world.base_url}/v1/docs/")
    assert page.status_code == 200
    html = page.text
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js" in html
    for cdn in ("cdn.jsdelivr", "unpkg.com", "cdnjs"):
        assert cdn not in html
    asset = httpx.get(
        f"{live_world.base_url}/static/drf_spectacular_sidecar/swagger-ui-dist/"
        "swagger-ui-bundle.js"
    )
    assert asset.status_code == 200 and len(asset.content) > 100_000


def test_component_names_read_well_in_generated_clients(client):
    """COMPONENT_SPLIT_REQUEST adds "Request" to every request body's component: the
    serializers' names must not end in it already (HeartbeatRequestRequest)."""
    doc = client.get("/v1/schema/?format=json").json()
    names = set(doc["components"]["schemas"])
    assert not [n for n in names if n.endswith("RequestRequest")]
    assert {"ClaimNextRequest", "HeartbeatRequest", "StatusReportRequest", "ReleaseRequest",
            "ReasonRequest", "BatchHeartbeatRequest", "BatchReportRequest", "JobCreateRequest",
            "JobAgentCreateRequest", "AgentTokenCreateRequest"} <= names
    # Free-form objects a client builds or reads are components of their own: a generated
    # client has one JobAgentConfig model, not JobJobAgentConfig, JobCreateRequestJobAgentConfig...
    shapes = doc["components"]["schemas"]
    for shape, prop, component in [("JobCreateRequest", "job_agent_config", "JobAgentConfig"),
                                   ("Job", "job_agent_config", "JobAgentConfig"),
                                   ("JobDetail", "job_agent_config", "JobAgentConfig"),
                                   ("ClaimedJob", "job_agent_config", "JobAgentConfig"),
                                   ("JobCreateRequest", "dispatch_context", "DispatchContext"),
                                   ("ClaimedJob", "dispatch_context", "DispatchContext")]:
        assert component_of(shapes[shape]["properties"][prop]) == component, (shape, prop)


def component_of(schema: dict) -> str | None:
    """The component a property refers to ($ref, or an allOf of one $ref with a description)."""
    ref = schema.get("$ref") or (schema.get("allOf") or [{}])[0].get("$ref")
    return ref.rsplit("/", 1)[-1] if ref else None
