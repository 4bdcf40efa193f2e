"""Artifact uploads and downloads on the real server `make run` uses (gunicorn): a 100 MiB
body streams to storage without the worker's peak RSS growing by anything like its size,
chunked bodies (no Content-Length) included, and the download streams too."""

import hashlib
from pathlib import Path

import httpx
import pytest

from jobqueue import lifecycle, states
from jobqueue.models import JobArtifact
from tests.e2e.harness import peak_rss_bytes
from tests.factories import JobFactory

from .conftest import artifact_server, make_world

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e]

MiB = 1024 * 1024
SIZE = 100 * MiB
PIECE = b"0123456789abcdef" * 4096  # 64 KiB


@pytest.fixture
def server(transactional_db, tmp_path):
    with artifact_server(tmp_path, SIZE, threads=2) as stack:
        yield stack


def worker_pid(master: int) -> int:
    children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


def body(total: int):
    sent = 0
    while sent < total:
        piece = PIECE[: total - sent]
        sent += len(piece)
        yield piece


def expected_sha(total: int) -> str:
    h = hashlib.sha256()
    for piece in body(total):
        h.update(piece)
    return h.hexdigest()


def test_a_100_mib_upload_streams_through_gunicorn(server, record_property):
    world = make_world()
    job = JobFactory(job_agent=world.agent)
    grant = lifecycle.claim_job(world.agent, job.id)
    base = f"{server.url}/v1/workspaces/{world.workspace.id}/jobs/{job.id}"
    agent = {"Authorization": f"Bearer {world.token}", "X-Claim-Id": str(grant.claim_id),
             "Content-Type": "application/octet-stream"}
    pid = worker_pid(server.server.pid)
    with httpx.Client(timeout=120) as http:
        # Warm the worker up (imports, connections) with a small upload first.
        r = http.put(f"{base}/artifacts/warm.bin", content=b"warm", headers=agent)
        assert r.status_code == 201, r.text
        before = peak_rss_bytes(pid)
        r = http.put(f"{base}/artifacts/big.bin", content=body(SIZE),
                     headers={**agent, "Content-Length": str(SIZE)})
        assert r.status_code == 201, r.text
        assert r.json()["size"] == SIZE and r.json()["sha256"] == expected_sha(SIZE)
        grown = peak_rss_bytes(pid) - before
        record_property("upload_peak_rss_growth_mib", round(grown / MiB, 1))
        print(f"100 MiB upload: worker peak RSS {before / MiB:.1f} MiB -> +{grown / MiB:.1f} MiB")
        assert grown < 20 * MiB, grown

        # Chunked, without Content-Length: read from the server's terminated input.
        r = http.put(f"{base}/artifacts/chunked.bin", content=body(3 * MiB), headers=agent)
        assert r.request.headers.get("Transfer-Encoding") == "chunked"
        assert r.status_code == 201 and r.json()["size"] == 3 * MiB
        # Over the cap: refused while streaming, nothing kept.
        r = http.put(f"{base}/artifacts/over.bin", content=body(SIZE + 1), headers=agent)
        assert r.status_code == 413 and r.json()["code"] == "output_too_large"
        assert not JobArtifact.objects.filter(name="over.bin").exists()

        lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL)
        before = peak_rss_bytes(pid)
        h = hashlib.sha256()
        with http.stream("GET", f"{base}/artifacts/big.bin",
                         headers={"X-API-Key": world.key}) as r:
            assert r.status_code == 200
            assert r.headers["Content-Length"] == str(SIZE)
            assert r.headers["ETag"] == f'"{expected_sha(SIZE)}"'
            for piece in r.iter_bytes():
                h.update(piece)
        assert h.hexdigest() == expected_sha(SIZE)
        grown = peak_rss_bytes(pid) - before
        record_property("download_peak_rss_growth_mib", round(grown / MiB, 1))
        print(f"100 MiB download: worker peak RSS +{grown / MiB:.1f} MiB")
        assert grown < 20 * MiB, grown


def test_a_server_killed_mid_upload_publishes_nothing_and_clean_up_removes_it(server):
    """A crash between staging and publication, for real: the API server is SIGKILLed while
    an upload streams. Its `uploading` row and partial file stay behind, are never listed,
    and go once the claim is no longer live (here: reaped)."""
    import threading
    import time

    from django.core.management import call_command

    from jobqueue.db import NowPlusSeconds
    from jobqueue.models import JobClaim
    from tests.utils import wait_for

    world = make_world()
    job = JobFactory(job_agent=world.agent)
    grant = lifecycle.claim_job(world.agent, job.id)
    url = f"{server.url}/v1/workspaces/{world.workspace.id}/jobs/{job.id}/artifacts/big.bin"
    headers = {"Authorization": f"Bearer {world.token}", "X-Claim-Id": str(grant.claim_id),
               "Content-Type": "application/octet-stream", "Content-Length": str(SIZE)}
    sent = []

    def slow_body():
        for piece in body(SIZE):
            sent.append(len(piece))
            if sum(sent) > 2 * MiB:
                time.sleep(0.05)  # the rest trickles in until the server dies
            yield piece

    def upload():
        try:
            httpx.put(url, content=slow_body(), headers=headers, timeout=60)
        except httpx.HTTPError:
            pass  # the server is gone

    thread = threading.Thread(target=upload, daemon=True)
    thread.start()
    wait_for(lambda: JobArtifact.objects.filter(job=job, state="uploading").exists()
             and sum(sent) > 3 * MiB, 30, "the upload to be under way")
    server.kill_server()
    thread.join(30)
    row = JobArtifact.objects.get(job=job)
    assert row.state == "uploading" and row.published_at is None
    partial = server.store / row.storage_key
    assert partial.exists() and 0 < partial.stat().st_size < SIZE
    # The agent's claim cannot publish it: the report after a crash publishes staged files
    # only, and the uploading one never was.
    JobClaim.objects.filter(job=job).update(claim_expires_at=NowPlusSeconds(-1))
    assert lifecycle.reap_expired_claims_once(10).reaped == 1
    from django.test import override_settings

    with override_settings(STORAGES={"artifacts": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(server.store)}}}):
        call_command("clean_artifacts")
    assert not JobArtifact.objects.exists()
    assert not partial.exists()
