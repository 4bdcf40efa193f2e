"""The error contract: every error is {"code", "detail"[, "fields"]}, bad input changes
nothing and is never a 500. In-process client unless a real server matters."""

import io
import json
import sys
import uuid

import pytest
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from django.test import RequestFactory

from jobqueue import lifecycle
from jobqueue.models import Job, JobClaim, JobEvent
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def claimed(world):
    job = JobFactory(job_agent=world.agent)
    grant = lifecycle.claim_job(world.agent, job.id)
    return job, str(grant.claim_id)


def _state():
    return (
        sorted(Job.objects.values_list("id", "status", "attempt", "message", "updated_at")),
        sorted(JobClaim.objects.values_list("job_id", "claim_expires_at")),
        JobEvent.objects.count(),
    )


def _is_error(r, status, code):
    assert r.status_code == status, (r.status_code, r.content)
    body = r.json()
    assert body["code"] == code and isinstance(body["detail"], str) and body["detail"]
    assert set(body) <= {"code", "detail", "fields"}
    return body


# --- 400 ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, field",
    [
        ({}, "claim_id"),
        ({"claim_id": "not-a-uuid"}, "claim_id"),
        ({"claim_id": 12}, "claim_id"),
        ({"claim_id": None}, "claim_id"),
    ],
)
def test_heartbeat_needs_a_claim_id(world, claimed, body, field):
    job, _ = claimed
    before = _state()
    r = world.agent_caller().post(f"jobs/{job.id}/heartbeat", json=body)
    assert field in _is_error(r, 400, "validation_error")["fields"]
    assert _state() == before


@pytest.mark.parametrize("body", [{"status": "successful"},
                                  {"status": "successful", "claim_id": None}])
def test_status_report_needs_a_claim_id(world, claimed, body):
    job, _ = claimed
    before = _state()
    r = world.agent_caller().put(f"jobs/{job.id}/status", json=body)
    assert "claim_id" in _is_error(r, 400, "validation_error")["fields"]
    assert _state() == before


@pytest.mark.parametrize(
    "extra, field",
    [
        ({"status": "done"}, "status"),
        ({"status": "expired"}, "status"),
        ({"status": "queued"}, "status"),
        ({}, "status"),
        ({"status": "successful", "external_id": "x" * 256}, "external_id"),
        ({"status": "successful", "message": ["not", "text"]}, "message"),
    ],
)
def test_status_report_validation(world, claimed, extra, field):
    job, claim_id = claimed
    before = _state()
    r = world.agent_caller().put(f"jobs/{job.id}/status", json={"claim_id": claim_id, **extra})
    assert field in _is_error(r, 400, "validation_error")["fields"]
    assert _state() == before


@pytest.mark.parametrize(
    "body, field",
    [
        ({}, "job_agent_id"),
        ({"job_agent_id": "nope"}, "job_agent_id"),
        ({"job_agent_id": "00000000-0000-4000-8000-000000000000"}, "job_agent_id"),
        ({"priority": 2**31}, "priority"),
        ({"priority": "high"}, "priority"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": 101}, "max_attempts"),
        ({"delay_seconds": -1}, "delay_seconds"),
        ({"dispatch_context": ["a", "list"]}, "dispatch_context"),
        ({"job_agent_config": "text"}, "job_agent_config"),
        ({"external_id": "x" * 256}, "external_id"),
    ],
)
def test_create_job_validation(world, body, field):
    body = {"job_agent_id": str(world.agent.id), **body}
    if "job_agent_id" in body and body["job_agent_id"] is None:
        del body["job_agent_id"]
    if field == "job_agent_id" and body == {"job_agent_id": str(world.agent.id)}:
        body = {}
    before = _state()
    r = world.producer().post("jobs", json=body)
    assert field in _is_error(r, 400, "validation_error")["fields"], r.json()
    assert _state() == before


@pytest.mark.parametrize(
    "body, field",
    [
        ({"name": ""}, "name"),
        ({"name": "x", "lease_seconds": 1}, "lease_seconds"),
        ({"name": "x", "lease_seconds": 3601}, "lease_seconds"),
        ({"name": "x", "max_attempts": 0}, "max_attempts"),
        ({"name": "x", "max_attempts": 1000}, "max_attempts"),
    ],
)
def test_create_agent_bounds(world, body, field):
    r = world.producer().post("job-agents", json=body)
    assert field in _is_error(r, 400, "validation_error")["fields"]


def test_duplicate_agent_name_is_400(world):
    r = world.producer().post("job-agents", json={"name": world.agent.name})
    assert "name" in _is_error(r, 400, "validation_error")["fields"]


@pytest.mark.parametrize("body", [{"limit": 0}, {"limit": 101}, {"limit": "all"}])
def test_batch_claim_limit_bounds(world, body):
    JobFactory(job_agent=world.agent)
    before = _state()
    r = world.agent_caller().post(f"job-agents/{world.agent.id}/jobs/claim", json=body)
    assert "limit" in _is_error(r, 400, "validation_error")["fields"]
    assert _state() == before


def test_release_retry_after_bounds(world, claimed):
    job, claim_id = claimed
    before = _state()
    r = world.agent_caller().post(
        f"jobs/{job.id}/release", json={"claim_id": claim_id, "retry_after_seconds": 86401}
    )
    assert "retry_after_seconds" in _is_error(r, 400, "validation_error")["fields"]
    assert _state() == before


@pytest.mark.parametrize(
    "raw",
    [
        b"{not json",
        b"[1, 2]",
        b'"a string"',
        b"null",
        b'{"claim_id": "\\u0000"}',
        b'{"claim_id": NaN}',
        b"[" * 50000 + b"]" * 50000,
    ],
)
def test_malformed_bodies_are_400(world, claimed, raw):
    job, _ = claimed
    before = _state()
    r = world.agent_caller().request("POST", f"jobs/{job.id}/heartbeat", raw=raw)
    _is_error(r, 400, "validation_error")
    assert _state() == before


@pytest.mark.parametrize(
    "value",
    ['"nul \\u0000 inside"', '"lone \\ud800 surrogate"', "1e999", '{"k\\u0000": 1}'],
)
def test_values_the_database_cannot_store_are_400_not_500(world, claimed, value):
    job, claim_id = claimed
    before = _state()
    agent_id = str(world.agent.id)
    raw = '{"job_agent_id": "' + agent_id + '", "dispatch_context": {"v": ' + value + "}}"
    r = world.producer().request("POST", "jobs", raw=raw.encode())
    _is_error(r, 400, "validation_error")
    raw = '{"claim_id": "' + claim_id + '", "status": "successful", "result": ' + value + "}"
    r = world.agent_caller().request("PUT", f"jobs/{job.id}/status", raw=raw.encode())
    _is_error(r, 400, "validation_error")
    assert _state() == before


def test_list_filters_and_cursor_validation(world):
    producer = world.producer()
    _is_error(producer.get("jobs?status=bogus"), 400, "validation_error")
    _is_error(producer.get("jobs?job_agent_id=bogus"), 400, "validation_error")
    _is_error(producer.get("jobs?cursor=bogus"), 400, "validation_error")
    # A well-encoded cursor whose position is nonsense.
    _is_error(producer.get("jobs?cursor=cD1ub3QtYS1kYXRl"), 400, "validation_error")
    _is_error(producer.get("jobs?page_size=0"), 400, "validation_error")
    _is_error(producer.get("jobs?page_size=x"), 400, "validation_error")
    agent = world.agent_caller()
    _is_error(agent.get(f"job-agents/{world.agent.id}/jobs?status=nope"), 400,
              "validation_error")
    _is_error(agent.get(f"job-agents/{world.agent.id}/jobs?cursor=cD1ub3Q%3D"), 400,
              "validation_error")


@pytest.mark.parametrize("key", ["a\x00b", "tab\there", "x" * 256, ""])
def test_bad_idempotency_keys_are_400_and_create_nothing(world, key):
    r = world.producer().post(
        "jobs", json={"job_agent_id": str(world.agent.id)}, headers={"Idempotency-Key": key}
    )
    _is_error(r, 400, "validation_error")
    assert Job.objects.count() == 0


def test_a_cursor_cannot_be_aimed_at_another_tenants_row(world):
    """Cursors are signed: one naming a job the caller never listed (here another
    workspace's) is refused, so paging cannot tell whether such a job exists."""
    import base64

    from tests.factories import JobAgentFactory

    JobFactory(job_agent=world.agent)
    foreign = JobFactory(job_agent=JobAgentFactory())
    producer = world.producer()
    for forged in (
        base64.urlsafe_b64encode(f"n:{foreign.id}".encode()).decode().rstrip("="),
        f"n.{foreign.id}",
        f"n.{foreign.id}:forged-signature",
    ):
        _is_error(producer.get(f"jobs?cursor={forged}"), 400, "validation_error")
    # A cursor issued for one listing is not valid on another.
    JobFactory(job_agent=world.agent)
    issued = producer.get("jobs?page_size=1").json()["next"].split("cursor=", 1)[1]
    _is_error(world.agent_caller().get(f"job-agents/{world.agent.id}/jobs?cursor={issued}"),
              400, "validation_error")


def test_cursor_pagination_walks_every_job_once(world):
    for priority in (1, 1, 2, 3, 3):
        JobFactory(job_agent=world.agent, priority=priority)
    seen, url = [], f"job-agents/{world.agent.id}/jobs?page_size=2"
    caller = world.agent_caller()
    while url:
        page = caller.get(url).json()
        seen += [item["id"] for item in page["results"]]
        url = page["next"] and page["next"].split("testserver", 1)[1]
    assert len(seen) == len(set(seen)) == 5
    priorities = [Job.objects.get(id=i).priority for i in seen]
    assert priorities == sorted(priorities, reverse=True)
    # Many jobs share a created_at (the clock's resolution): no repeats, none skipped,
    # and `previous` walks back over the same pages.
    pages, url, producer = [], "jobs?page_size=2", world.producer()
    while url:
        page = producer.get(url).json()
        pages.append([item["id"] for item in page["results"]])
        last_previous = page["previous"]
        url = page["next"] and page["next"].split("testserver", 1)[1]
    assert [len(p) for p in pages] == [2, 2, 1]
    assert len({i for p in pages for i in p}) == 5
    back, url = [], last_previous.split("testserver", 1)[1]
    while url:
        page = producer.get(url).json()
        back.append([item["id"] for item in page["results"]])
        url = page["previous"] and page["previous"].split("testserver", 1)[1]
    assert back == pages[:-1][::-1]


# --- 404, 405 ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "method, path",
    [
        ("GET", "/v1/workspaces/not-a-uuid/jobs"),
        ("GET", "/v1/workspaces/{ws}/jobs/123"),
        ("GET", "/v1/workspaces/{ws}/job-agents/zzz"),
        ("GET", "/v1/workspaces/{ws}/job-agents/zzz/jobs"),
        ("POST", "/v1/workspaces/{ws}/job-agents/{agent}/jobs/xyz/claim"),
        ("POST", "/v1/workspaces/{ws}/jobs/%20/cancel"),
        ("DELETE", "/v1/workspaces/{ws}/job-agents/{agent}/tokens/t0k3n"),
        ("GET", "/v1/workspaces/{ws}/no-such-thing"),
        ("GET", "/v1/nothing-here"),
    ],
)
def test_malformed_ids_and_unknown_paths_are_json_404(world, method, path):
    path = path.format(ws=world.workspace.id, agent=world.agent.id)
    r = world.producer().request(method, path)
    _is_error(r, 404, "not_found")


def test_heartbeat_on_a_malformed_job_id_is_404(world):
    r = world.agent_caller().post(
        "jobs/12345/heartbeat", json={"claim_id": "00000000-0000-4000-8000-000000000000"}
    )
    _is_error(r, 404, "not_found")


def test_wrong_method_is_405(world, claimed):
    job, _ = claimed
    r = world.agent_caller().get(f"job-agents/{world.agent.id}/jobs/{job.id}/claim")
    _is_error(r, 405, "method_not_allowed")
    assert "POST" in r.headers["Allow"]
    _is_error(world.producer().delete("jobs"), 405, "method_not_allowed")


# --- 409 ---------------------------------------------------------------------------------


def test_heartbeat_after_expiry_is_lease_expired(world, claimed):
    from jobqueue.db import NowPlusSeconds

    job, claim_id = claimed
    JobClaim.objects.filter(job_id=job.id).update(claim_expires_at=NowPlusSeconds(-1))
    r = world.agent_caller().post(f"jobs/{job.id}/heartbeat", json={"claim_id": claim_id})
    _is_error(r, 409, "lease_expired")
    # A terminal report with the current claim is still accepted before the reaper runs.
    done = world.agent_caller().put(
        f"jobs/{job.id}/status", json={"claim_id": claim_id, "status": "successful"}
    )
    assert done.status_code == 200


def test_wrong_claim_id_is_claim_superseded(world, claimed):
    job, _ = claimed
    before = _state()
    r = world.agent_caller().post(
        f"jobs/{job.id}/release", json={"claim_id": "00000000-0000-4000-8000-000000000000"}
    )
    _is_error(r, 409, "claim_superseded")
    assert _state()[:2] == before[:2]


def test_cancel_finished_job_is_job_finished(world, claimed):
    job, claim_id = claimed
    lifecycle.report_status(job.id, uuid.UUID(claim_id), "successful")
    _is_error(world.producer().post(f"jobs/{job.id}/cancel"), 409, "job_finished")


# --- 413, 411, 415 -------------------------------------------------------------------------


@pytest.fixture
def small_cap(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "MAX_REQUEST_BYTES": 200}
    return 200


def test_oversized_body_is_413(world, claimed, small_cap):
    job, claim_id = claimed
    before = _state()
    r = world.agent_caller().put(
        f"jobs/{job.id}/status",
        json={"claim_id": claim_id, "status": "successful", "message": "x" * 300},
    )
    _is_error(r, 413, "payload_too_large")
    assert _state() == before


def _wsgi(world, path, body: bytes, *, terminated=True):
    environ = RequestFactory()._base_environ(
        PATH_INFO=f"/v1/workspaces/{world.workspace.id}/{path}",
        REQUEST_METHOD="POST",
        CONTENT_TYPE="application/json",
        HTTP_AUTHORIZATION=f"Bearer {world.token}",
        HTTP_TRANSFER_ENCODING="chunked",
    )
    environ.pop("CONTENT_LENGTH", None)
    environ["wsgi.input"] = io.BytesIO(body)  # what the server hands on: dechunked bytes
    environ["wsgi.errors"] = sys.stderr
    if terminated:
        environ["wsgi.input_terminated"] = True
    started = {}

    def start_response(status, headers, exc_info=None):
        started["status"] = int(status.split()[0])

    # As Django's test client does: keep the test's database connection open.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        content = b"".join(WSGIHandler()(environ, start_response))
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)
    return started["status"], json.loads(content) if content else None


def test_chunked_bodies_are_capped_and_read(world, claimed, small_cap):
    job, claim_id = claimed
    before = _state()
    big = json.dumps({"claim_id": claim_id, "pad": "x" * 500}).encode()
    status, body = _wsgi(world, f"jobs/{job.id}/heartbeat", big)
    assert (status, body["code"]) == (413, "payload_too_large")
    assert _state() == before
    status, body = _wsgi(world, f"jobs/{job.id}/heartbeat", big, terminated=False)
    assert (status, body["code"]) == (411, "length_required")
    small = json.dumps({"claim_id": claim_id}).encode()
    status, body = _wsgi(world, f"jobs/{job.id}/heartbeat", small)
    assert status == 200 and body["job_id"] == str(job.id)


@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "application/xml"]
)
def test_non_json_body_is_415(world, claimed, content_type):
    job, claim_id = claimed
    before = _state()
    r = world.agent_caller().request(
        "POST", f"jobs/{job.id}/heartbeat", raw=f"claim_id={claim_id}",
        content_type=content_type,
    )
    _is_error(r, 415, "unsupported_media_type")
    r = world.agent_caller().request(
        "POST", f"job-agents/{world.agent.id}/jobs/{job.id}/claim", raw="x",
        content_type=content_type,
    )
    _is_error(r, 415, "unsupported_media_type")
    assert _state() == before


# --- 422 ---------------------------------------------------------------------------------


def test_idempotency_key(world):
    producer = world.producer()
    body = {"job_agent_id": str(world.agent.id), "dispatch_context": {"n": 1}}
    key = {"Idempotency-Key": "order-42"}
    first = producer.post("jobs", json=body, headers=key)
    assert first.status_code == 201
    replay = producer.post("jobs", json=body, headers=key)
    assert replay.status_code == 200 and replay.json()["id"] == first.json()["id"]
    assert first.json()["idempotency_key"] == "order-42"
    reused = producer.post("jobs", json={**body, "dispatch_context": {"n": 2}}, headers=key)
    _is_error(reused, 422, "idempotency_key_reused")
    assert Job.objects.filter(idempotency_key="order-42").count() == 1
    too_long = producer.post("jobs", json=body, headers={"Idempotency-Key": "k" * 256})
    _is_error(too_long, 400, "validation_error")


# --- 429 ---------------------------------------------------------------------------------


def test_throttled_per_credential_with_retry_after(world, settings):
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {"agent": "3/d", "workspace": "2/d"},
    }
    agent = world.agent_caller()
    path = f"job-agents/{world.agent.id}/jobs"
    assert [agent.get(path).status_code for _ in range(3)] == [200, 200, 200]
    r = agent.get(path)
    _is_error(r, 429, "throttled")
    assert 1 <= int(r.headers["Retry-After"]) <= 86400
    # Another agent, and the workspace key, have their own counters.
    assert world.agent_caller(world.other_token).get(
        f"job-agents/{world.other_agent.id}/jobs").status_code == 200
    producer = world.producer()
    assert [producer.get("jobs").status_code for _ in range(3)] == [200, 200, 429]


def test_throttle_can_be_disabled(world, settings):
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"agent": "none", "workspace": ""}
    }
    agent = world.agent_caller()
    assert {agent.get(f"job-agents/{world.agent.id}/jobs").status_code for _ in range(5)} == {200}


def test_default_rates_allow_thousands_per_second(settings):
    from rest_framework.throttling import SimpleRateThrottle

    rates = settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]
    for scope in ("agent", "workspace"):
        num, period = SimpleRateThrottle.parse_rate(None, rates[scope])
        assert num / period >= 5000
