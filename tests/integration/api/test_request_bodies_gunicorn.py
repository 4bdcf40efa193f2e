"""Request bodies that do not arrive whole, on the real server `make run` uses (gunicorn),
over raw sockets: an upload or log chunk cut short by the client is refused and nothing of it
is kept; an answer that leaves a large body unread says `Connection: close` and closes, so a
client never sends its next request on a connection the server is about to drop."""

import http.client
import json
import socket

import pytest

from jobqueue import lifecycle
from jobqueue.models import JobArtifact, JobLogChunk
from tests.e2e.harness import Stack
from tests.factories import JobFactory

from .conftest import make_world

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e]

MAX_ARTIFACT = 100_000


@pytest.fixture
def server(transactional_db, tmp_path):
    store = tmp_path / "artifacts"
    stack = Stack(tmp_path, server_env={
        "JOBQUEUE_ARTIFACT_STORAGE_OPTIONS": json.dumps({"location": str(store)}),
        "JOBQUEUE_MAX_ARTIFACT_BYTES": MAX_ARTIFACT,
    })
    stack.store = store
    try:
        stack.start_server(workers=1, threads=4)
        yield stack
    finally:
        stack.close()


@pytest.fixture
def claimed():
    world = make_world()
    job = JobFactory(job_agent=world.agent)
    grant = lifecycle.claim_job(world.agent, job.id)
    base = f"/v1/workspaces/{world.workspace.id}/jobs/{job.id}"
    headers = {"Authorization": f"Bearer {world.token}", "X-Claim-Id": str(grant.claim_id)}
    return job, base, headers


def head_of(method, path, headers) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def exchange(server, request: bytes, *, half_close: bool):
    """Send `request` on a new connection (then half-close it, as a client that stops
    sending does) and read the answer: (the response, its body, the socket)."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    sock.sendall(request)
    if half_close:
        sock.shutdown(socket.SHUT_WR)
    response = http.client.HTTPResponse(sock)
    response.begin()
    return response, response.read(), sock


def stored_files(store):
    return [p for p in store.rglob("*") if p.is_file()] if store.exists() else []


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_an_upload_cut_short_is_400_and_keeps_nothing(server, claimed, framing):
    job, base, headers = claimed
    headers = {**headers, "Content-Type": "application/octet-stream"}
    if framing == "content-length":
        body = b"0123456789"  # of 1,000 declared
        headers["Content-Length"] = "1000"
    else:
        body = b"3e8\r\n0123456789"  # a 1,000-byte chunk, 10 bytes of it
        headers["Transfer-Encoding"] = "chunked"
    response, raw, sock = exchange(
        server, head_of("PUT", f"{base}/artifacts/a.bin", headers) + body, half_close=True)
    sock.close()
    assert response.status == 400, raw
    assert json.loads(raw)["code"] == "incomplete_body"
    assert not JobArtifact.objects.filter(job=job).exists()
    assert stored_files(server.store) == []


def test_a_log_chunk_cut_short_is_400_and_appends_nothing(server, claimed):
    job, base, headers = claimed
    headers = {**headers, "Content-Type": "text/plain", "Content-Length": "1000"}
    response, raw, sock = exchange(
        server, head_of("PATCH", f"{base}/log", headers) + b"0123456789", half_close=True)
    sock.close()
    assert response.status == 400, raw
    assert json.loads(raw)["code"] == "incomplete_body"
    assert not JobLogChunk.objects.filter(log__job=job).exists()
