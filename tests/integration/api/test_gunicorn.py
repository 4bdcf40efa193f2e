"""The request size cap on the real server `make run` uses (gunicorn), chunked bodies
included: a streamed body without Content-Length is read, bounded, and handed to the view."""

import json

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
