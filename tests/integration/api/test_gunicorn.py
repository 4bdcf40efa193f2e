"""The request size cap on the real server `make run` uses (gunicorn), chunked bodies
included: a streamed body without Content-Length is read, bounded, and handed to the view."""

import json
import time

import httpx
import pytest

from jobqueue import lifecycle
from jobqueue.models import JobClaim
from tests.e2e.harness import Stack
from tests.factories import JobFactory

from .conftest import make_world

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e]

CAP = 4096


@pytest.fixture
def server(transactional_db, tmp_path):
    stack = Stack(tmp_path, server_env={"JOBQUEUE_MAX_REQUEST_BYTES": CAP})
    try:
        stack.start_server(workers=1, threads=2)
        yield stack
    finally:
        stack.close()


def _chunks(data: bytes, size=1000):
    for i in range(0, len(data), size):
        yield data[i:i + size]


def test_chunked_bodies_through_gunicorn(server):
    world = make_world()
    job = JobFactory(job_agent=world.agent)
    grant = lifecycle.claim_job(world.agent, job.id)
    url = f"{server.url}/v1/workspaces/{world.workspace.id}/jobs/{job.id}/heartbeat"
    headers = {"Authorization": f"Bearer {world.token}", "Content-Type": "application/json"}
    before = JobClaim.objects.get(job_id=job.id).claim_expires_at
    with httpx.Client(timeout=30) as http:
        small = json.dumps({"claim_id": str(grant.claim_id)}).encode()
        r = http.post(url, content=_chunks(small, 10), headers=headers)
        assert r.request.headers.get("Transfer-Encoding") == "chunked"
        assert "Content-Length" not in r.request.headers
        assert r.status_code == 200, r.text
        assert JobClaim.objects.get(job_id=job.id).claim_expires_at > before

        big = b'{"claim_id": "%s", "pad": "' % str(grant.claim_id).encode() + b"x" * CAP + b'"}'
        r = http.post(url, content=_chunks(big), headers=headers)
        assert r.status_code == 413 and r.json()["code"] == "payload_too_large"
        r = http.post(url, content=big, headers=headers)  # with Content-Length
        assert r.status_code == 413 and r.json()["code"] == "payload_too_large"


def _new_log_lines(server, before: int, settle: float = 0.5) -> list[str]:
    time.sleep(settle)  # let the worker write what it logs for the request
    return server.server.output()[before:].splitlines()


def test_a_bad_host_header_through_gunicorn(server):
    """A Host header the server does not serve: JSON under /v1/, HTML for the admin."""
    with httpx.Client(base_url=server.url, timeout=30) as http:
        before = len(server.server.output())
        r = http.get("/v1/workspaces/x/jobs", headers={"Host": "evil.example"})
        assert r.status_code == 400 and r.headers["Content-Type"] == "application/json"
        assert r.json() == {"code": "bad_request",
                            "detail": "The Host header names a host this server does not serve."}
        r = http.get("/admin/login/", headers={"Host": "evil.example"})
        assert r.status_code == 400 and r.headers["Content-Type"].startswith("text/html")
        # One WARNING line per request, never a traceback at ERROR (issue #32, item 12).
        lines = _new_log_lines(server, before)
        assert len(lines) == 2, "\n".join(lines[:40])
        assert all(" WARNING django.security.DisallowedHost " in line for line in lines)


def test_an_undecodable_admin_form_through_gunicorn(server):
    """A form Django cannot decode (charset=utf-16, with a CSRF cookie, no login needed): a
    400 and one log line (it was a 500 and ~700 lines of chained tracebacks)."""
    with httpx.Client(base_url=server.url, timeout=30) as http:
        before = len(server.server.output())
        r = http.post("/admin/login/", content="username=a&password=b".encode("utf-16"),
                      headers={"Content-Type": "application/x-www-form-urlencoded; "
                                               "charset=utf-16",
                               "Cookie": "csrftoken=" + "a" * 32})
        assert r.status_code == 400 and r.headers["Content-Type"].startswith("text/html")
        lines = _new_log_lines(server, before)
        assert len(lines) == 1, "\n".join(lines[:40])
        assert "Bad Request: /admin/login/" in lines[0]
