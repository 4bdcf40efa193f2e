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
from tests.factories import JobFactory

from .conftest import artifact_server, make_world

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e]

MAX_ARTIFACT = 100_000


@pytest.fixture
def server(transactional_db, tmp_path):
    with artifact_server(tmp_path, MAX_ARTIFACT, threads=4) as stack:
        yield stack


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


def refused_upload(claimed, refusal):
    """Headers of a 10 MiB request refused before its body is read, and the answer due."""
    job, base, headers = claimed
    ten_mib = str(10 * 1024 * 1024)
    if refusal == "413-artifact":  # over JOBQUEUE_MAX_ARTIFACT_BYTES: refused at once
        return ("PUT", f"{base}/artifacts/a.bin",
                {**headers, "Content-Length": ten_mib}, 413, "output_too_large")
    if refusal == "409-stale-claim":  # the claim ended: nothing it sends is read
        lifecycle.cancel_job(job.id)
        return ("PUT", f"{base}/artifacts/a.bin",  # under the cap, over what gunicorn drains
                {**headers, "Content-Length": str(MAX_ARTIFACT)}, 409, "job_cancelled")
    if refusal == "413-json":  # over JOBQUEUE_MAX_REQUEST_BYTES, refused by the middleware
        return ("POST", f"{base}/heartbeat", {**headers, "Content-Type": "application/json",
                                              "Content-Length": ten_mib},
                413, "payload_too_large")
    assert refusal == "401"
    return ("PUT", f"{base}/artifacts/a.bin",
            {**headers, "Authorization": "Bearer jqa_nope", "Content-Length": ten_mib},
            401, "authentication_failed")


@pytest.mark.parametrize("refusal", ["413-artifact", "409-stale-claim", "413-json", "401"])
def test_an_early_refusal_of_a_large_body_says_connection_close_and_closes(server, claimed,
                                                                          refusal):
    """The client has sent the headers and the first KiB of a 10 MiB body when the refusal
    comes: the answer says `Connection: close` and the server closes the connection, so
    the client sends its next request on a new one (the answer once said keep-alive, and
    the connection was dropped under the next request)."""
    method, path, headers, status, code = refused_upload(claimed, refusal)
    response, raw, sock = exchange(server, head_of(method, path, headers) + b"x" * 1024,
                                   half_close=False)
    try:
        assert (response.status, json.loads(raw)["code"]) == (status, code)
        assert response.getheader("Connection") == "close"
        assert sock.recv(1) == b""  # the server closed its side, without the rest
    finally:
        sock.close()


def test_a_body_read_to_its_end_keeps_the_connection(server, claimed):
    """An upload, and a refusal that read the whole body first, keep the connection alive:
    the next request goes on the same connection."""
    job, base, headers = claimed
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("PUT", f"{base}/artifacts/a.bin", body=b"x" * 90_000, headers=headers)
        response = conn.getresponse()
        assert response.status == 201 and response.getheader("Connection") == "keep-alive"
        response.read()
        sock = conn.sock
        body = json.dumps({"claim_id": "not-a-uuid", "pad": "x" * 90_000})
        conn.request("POST", f"{base}/heartbeat", body=body,
                     headers={**headers, "Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == 400 and response.getheader("Connection") == "keep-alive"
        response.read()
        conn.request("PATCH", f"{base}/log", body=b"hello\n",
                     headers={**headers, "Content-Type": "text/plain"})
        response = conn.getresponse()
        assert response.status == 202
        response.read()
        conn.request("HEAD", f"{base}/log", headers=headers)  # headers only, then the next
        response = conn.getresponse()
        assert response.status == 200 and response.getheader("Content-Length") == "6"
        assert response.read() == b""
        conn.request("GET", f"{base}/log", headers=headers)
        response = conn.getresponse()
        assert response.status == 200 and response.read() == b"hello\n"
        assert conn.sock is sock  # one connection all along
    finally:
        conn.close()


def test_a_chunked_json_or_log_body_cut_short_is_400(server, claimed):
    """A chunked body the size cap reads (agents/middleware.py) cut short mid-chunk."""
    job, base, headers = claimed
    for method, path, ctype in [("PATCH", f"{base}/log", "text/plain"),
                                ("POST", f"{base}/heartbeat", "application/json")]:
        response, raw, sock = exchange(server, head_of(method, path, {
            **headers, "Content-Type": ctype, "Transfer-Encoding": "chunked"})
            + b"3e8\r\n0123456789", half_close=True)
        sock.close()
        assert response.status == 400, raw
        assert json.loads(raw)["code"] == "incomplete_body"
    assert not JobLogChunk.objects.filter(log__job=job).exists()
