"""Bad input that only the edge sees (headers, body framing, JSON shape) is a clear 400 or 401
that changes nothing, never a 500."""

import json

import pytest
from django.test import Client

from agents.parsers import MAX_DEPTH
from jobqueue.models import Job, JobEvent
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def _error(response, status, code):
    assert response.status_code == status, response.content
    body = json.loads(response.content)
    assert body["code"] == code and body["detail"]
    return body


def test_a_content_length_that_is_not_a_number_is_400(world):
    response = Client().generic(
        "POST", f"/v1/workspaces/{world.workspace.id}/jobs",
        data=json.dumps({"job_agent_id": str(world.agent.id)}), content_type="application/json",
        HTTP_X_API_KEY=world.key, CONTENT_LENGTH="twelve")
    body = _error(response, 400, "validation_error")
    assert body["detail"] == "Content-Length must be an integer."
    assert Job.objects.count() == 0


def test_json_nested_deeper_than_the_database_takes_is_400(world):
    deep = {"job_agent_id": str(world.agent.id), "dispatch_context": {}}
    inner = deep["dispatch_context"]
    for _ in range(MAX_DEPTH + 1):
        inner["x"] = {}
        inner = inner["x"]
    body = _error(world.producer().post("jobs", json=deep), 400, "validation_error")
    assert "nested deeper than 64 levels" in body["detail"]
    assert Job.objects.count() == 0
    # One level less is fine.
    ok = {"job_agent_id": str(world.agent.id), "dispatch_context": {}}
    inner = ok["dispatch_context"]
    for _ in range(MAX_DEPTH - 2):
        inner["x"] = {}
        inner = inner["x"]
    assert world.producer().post("jobs", json=ok).status_code == 201


def test_a_bearer_token_that_is_not_ascii_is_401(world):
    job = JobFactory(job_agent=world.agent)
    response = Client().post(
        f"/v1/workspaces/{world.workspace.id}/job-agents/{world.agent.id}/jobs/{job.id}/claim",
        HTTP_AUTHORIZATION="Bearer jqa_0123456789ab_s\u00e9cret".encode().decode("latin-1"))
    _error(response, 401, "authentication_failed")
    assert not JobEvent.objects.filter(job_id=job.id).exclude(kind=JobEvent.CREATED).exists()


def test_an_integer_too_long_to_read_is_400_saying_so(world):
    """Python reads integers of up to 4,300 digits from text; a longer one was refused as
    "numbers must be finite"."""
    raw = ('{"job_agent_id": "' + str(world.agent.id) + '", "dispatch_context": {"n": '
           + "7" * 4301 + "}}").encode()
    body = _error(world.producer().request("POST", "jobs", raw=raw), 400, "validation_error")
    assert body["detail"] == "JSON parse error - integers must have at most 4300 digits."
    assert Job.objects.count() == 0
    raw = raw.replace(b"7" * 4301, b"-" + b"7" * 4300)
    assert world.producer().request("POST", "jobs", raw=raw).status_code == 201
