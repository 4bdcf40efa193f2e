"""The service behind nginx, configured as documented (docs/deploy/nginx.conf, loaded by
tests/e2e/nginx.py with only its ports, upstream and certificate changed): slow clients hold
none of gunicorn's threads, the scheme reaches Django from nginx and never from a client, a
body over the artifact limit gets the service's error shape, and a real agent works through
it over TLS (a long-poll claim, heartbeats, the log, artifacts over nginx's in-memory buffer).

The slow-client case runs against gunicorn directly too, where it fails: gunicorn has no
timeout for a request's headers or body (a gthread worker waits up to 5 s for a new
connection's first byte, then reads the rest on one of its threads for as long as the client
takes), which is why nginx is part of the deployment (docs/deploying.md, "nginx in front")."""

import hashlib
import json
import re
import socket
import subprocess
import sys
import time

import httpx
import pytest
from django.contrib.auth.models import User

from agents import credentials
from jobqueue import states
from jobqueue.models import Job

from .harness import ROOT, Stack, wait_for
from .nginx import PrivateNginx

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

STATUS = re.compile(r'" (\d{3}) ')
SLOW_CLIENTS = 60  # half of them stop inside the request line, half inside an artifact's body


@pytest.fixture
def one_worker(request, transactional_db, tmp_path):
    """The API server as one gunicorn worker of 8 threads, logging every request it serves.
    With the parameter {"static": True}, after a `collectstatic` of its own (the admin's
    pages need it when DEBUG is off)."""
    stack = Stack(tmp_path, server_env={
        "JOBQUEUE_ARTIFACT_STORAGE_OPTIONS": json.dumps({"location": str(tmp_path / "artifacts")}),
        "DJANGO_STATIC_ROOT": tmp_path / "static", "DJANGO_SECURE_COOKIES": "1"})
    try:
        if getattr(request, "param", {}).get("static"):
            subprocess.run([sys.executable, "manage.py", "collectstatic", "--noinput", "-v0"],
                           cwd=ROOT, env=stack.env(**stack.server_env), check=True, timeout=300)
        stack.start_server(workers=1, threads=8, access_log=tmp_path / "access.log")
        yield stack
    finally:
        stack.close()


@pytest.fixture
def nginx(one_worker):
    proxy = PrivateNginx(one_worker.port).start()
    try:
        yield proxy
    finally:
        proxy.close()


def served(stack) -> list[str]:
    """The request lines gunicorn answered, from its access log."""
    return [line.split('"')[1] for line in (stack.tmp / "access.log").read_text().splitlines()]


def hold_partial_requests(connect, n: int) -> list[socket.socket]:
    held = []
    for i in range(n):
        sock = connect()
        if i % 2 == 0:  # a request line that never ends
            sock.sendall(b"GET /healthz HT")
        else:  # an artifact upload whose body stops after 64 KiB of 10 MB
            sock.sendall(b"PUT /v1/workspaces/w/jobs/j/artifacts/blob.bin HTTP/1.1\r\n"
                         b"Host: 127.0.0.1\r\nAuthorization: Bearer slow\r\n"
                         b"Content-Length: 10000000\r\n\r\n" + b"x" * 65536)
        held.append(sock)
    return held


@pytest.mark.parametrize("front", [
    "nginx",
    pytest.param("gunicorn", marks=pytest.mark.xfail(
        strict=True, raises=httpx.TimeoutException,
        reason="gunicorn alone: every thread reads a slow client's request")),
])
def test_slow_clients_leave_healthz_answering(front, one_worker, nginx, say):
    """While 60 clients hold partial requests against one worker of 8 threads, /healthz
    answers within 2 s (a generous bound: behind nginx it takes milliseconds; without nginx it
    never answers while they hold on)."""
    if front == "nginx":
        connect, url, verify = nginx.tls_socket, nginx.url, nginx.client_context()
    else:
        def connect():
            return socket.create_connection(("127.0.0.1", one_worker.port), timeout=10)
        url, verify = one_worker.url, True
    before = len(served(one_worker))
    held = hold_partial_requests(connect, SLOW_CLIENTS)
    try:
        started = time.monotonic()
        r = httpx.get(f"{url}/healthz", timeout=2, verify=verify)
        took = time.monotonic() - started
    finally:
        for sock in held:
            sock.close()
    assert (r.status_code, r.json()["status"]) == (200, "ok")
    # None of the slow requests reached gunicorn: nginx still reads them.
    wait_for(lambda: served(one_worker)[before:], 10, "the access log line")
    assert served(one_worker)[before:] == ["GET /healthz HTTP/1.1"]
    say(f"{front}: /healthz answered in {took * 1000:.0f} ms while {SLOW_CLIENTS} clients held "
        "partial requests against 1 worker of 8 threads")


def test_the_scheme_comes_from_nginx_never_from_the_client(one_worker, nginx, make_agent,
                                                           make_jobs):
    """Links the service builds say https with the client's host and port (X-Forwarded-Proto
    and Host from nginx, trusted by gunicorn from 127.0.0.1), whatever scheme headers the
    client sends; plain http is redirected to https."""
    agent, _ = make_agent()
    make_jobs(agent, 2, ["true"])
    key = credentials.issue_workspace_api_key(agent.workspace)
    spoofed = {"X-API-Key": key, "X-Forwarded-Proto": "http", "X-Forwarded-Ssl": "off",
               "X-Forwarded-Protocol": "plain"}
    with httpx.Client(verify=nginx.client_context(), timeout=10) as client:
        for headers in ({"X-API-Key": key}, spoofed):
            r = client.get(f"{nginx.url}/v1/workspaces/{agent.workspace_id}/jobs",
                           params={"page_size": 1}, headers=headers)
            assert r.status_code == 200, r.text
            assert r.json()["next"].startswith(f"{nginx.url}/v1/workspaces/"), r.json()["next"]
    r = httpx.get(f"http://127.0.0.1:{nginx.http_port}/healthz", timeout=10)
    assert r.status_code == 301
    assert r.headers["location"] == "https://127.0.0.1/healthz"


@pytest.mark.parametrize("one_worker", [{"static": True}], indirect=True)
def test_an_operator_logs_in_to_the_admin_through_nginx(one_worker, nginx):
    """A browser's login form over https: Django's CSRF check compares the Origin with the
    request's scheme and host, so it passes only when the https scheme reached Django (from
    nginx's X-Forwarded-Proto, through gunicorn): no DJANGO_CSRF_TRUSTED_ORIGINS needed. The
    cookies are https-only (DJANGO_SECURE_COOKIES=1, as documented) and still work."""
    User.objects.create_superuser("ops", "ops@example.com", "a-long-pass-phrase")
    with httpx.Client(verify=nginx.client_context(), timeout=10) as browser:
        form = browser.get(f"{nginx.url}/admin/login/")
        assert form.status_code == 200
        assert "; secure" in form.headers["set-cookie"].lower()
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text)[1]
        r = browser.post(f"{nginx.url}/admin/login/?next=/admin/",
                         data={"username": "ops", "password": "a-long-pass-phrase",
                               "csrfmiddlewaretoken": token, "next": "/admin/"},
                         headers={"Origin": nginx.url, "Referer": f"{nginx.url}/admin/login/"})
        assert (r.status_code, r.headers.get("location")) == (302, "/admin/"), r.text[:500]
        assert browser.get(f"{nginx.url}/admin/").status_code == 200


def test_a_body_over_the_artifact_limit_gets_the_services_error_shape(one_worker, nginx):
    """nginx refuses a body over client_max_body_size (the artifact limit) from its
    Content-Length alone, in the service's JSON error shape, and gunicorn never sees it."""
    before = len(served(one_worker))
    with nginx.tls_socket() as sock:
        sock.sendall(b"PUT /v1/workspaces/w/jobs/j/artifacts/big.bin HTTP/1.1\r\n"
                     b"Host: 127.0.0.1\r\nContent-Length: 104857601\r\n\r\n")
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.endswith(b"}\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413 "), head
    assert b"Content-Type: application/json" in head, head
    assert json.loads(body)["code"] == "payload_too_large"
    assert served(one_worker)[before:] == []


def test_an_agent_works_through_nginx_over_tls(one_worker, nginx, make_agent, make_jobs, say):
    """The reference agent against nginx's https URL (trusting its certificate through
    SSL_CERT_FILE): long-poll claims, heartbeats, the log and a 3 MB artifact (buffered to a
    temporary file by nginx before gunicorn reads it) all go through, and the producer reads
    the artifact back through nginx."""
    agent, token = make_agent(lease_seconds=3)
    key = credentials.issue_workspace_api_key(agent.workspace)
    script = ('echo start; sleep 2; head -c 3000000 /dev/urandom > "$JOB_ARTIFACTS_DIR/blob.bin";'
              ' echo done')
    jobs = make_jobs(agent, 2, ["sh", "-c", script])
    one_worker.start_agent(agent, token, "tls", server_url=nginx.url, idle_max=5,
                           extra_env={"SSL_CERT_FILE": nginx.cert})
    ids = [j.id for j in jobs]
    wait_for(lambda: Job.objects.filter(id__in=ids, status=states.SUCCESSFUL).count() == 2, 60,
             "both jobs to succeed", on_fail=lambda: one_worker.logs() + nginx.log())
    with httpx.Client(verify=nginx.client_context(), timeout=30,
                      headers={"X-API-Key": key}) as client:
        for job_id in ids:
            api = f"{nginx.url}/v1/workspaces/{agent.workspace_id}/jobs/{job_id}"
            [listed] = client.get(f"{api}/artifacts").json()["results"]
            got = client.get(f"{api}/artifacts/blob.bin")
            assert (listed["size"], len(got.content)) == (3000000, 3000000)
            assert hashlib.sha256(got.content).hexdigest() == listed["sha256"]
            assert client.get(f"{api}/log").content == b"start\ndone\n"
    codes = [int(m[1]) for m in STATUS.finditer((one_worker.tmp / "access.log").read_text())]
    assert codes and [c for c in codes if c >= 500] == [], codes
    say(f"an agent through nginx over TLS: 2 jobs, 2 artifacts of 3 MB, {len(codes)} requests, "
        "no 5xx")
