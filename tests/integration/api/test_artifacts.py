"""PUT/GET jobs/{id}/artifacts[/{name}]: staged per attempt, published by the claim's
accepted successful report (single and batch), listed and downloaded by producers; the
seed-004 stale-attempt sequence; names, caps, media types; clean-up. In-process client."""

import hashlib

import pytest
from django.core.files.storage import FileSystemStorage

from jobqueue import lifecycle
from jobqueue.db import NowPlusSeconds
from jobqueue.lifecycle import artifacts
from jobqueue.models import JobArtifact, JobClaim
from tests.factories import JobFactory

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("own_artifact_storage")]


@pytest.fixture
def claimed(world):
    job = JobFactory(job_agent=world.agent, dispatch_context={"token": "s3cr3t-value"})
    grant = lifecycle.claim_job(world.agent, job.id)
    return job, str(grant.claim_id)


def upload(caller, job_id, claim_id, name, data: bytes, content_type="application/zip",
           **headers):
    if claim_id is not None:
        headers["X-Claim-Id"] = claim_id
    return caller.request("PUT", f"jobs/{job_id}/artifacts/{name}", raw=data,
                          content_type=content_type, headers=headers)


def report(caller, job_id, claim_id, status="successful"):
    return caller.put(f"jobs/{job_id}/status", json={"claim_id": claim_id, "status": status})


def listed(world, job_id):
    r = world.producer().get(f"jobs/{job_id}/artifacts")
    assert r.status_code == 200
    return {a["name"]: a for a in r.json()["results"]}


def stored_files(storage=None):
    storage = storage or artifacts.artifact_storage()
    found = []

    def walk(path):
        dirs, files = storage.listdir(path)
        found.extend(f"{path}/{f}".lstrip("/") for f in files)
        for d in dirs:
            walk(f"{path}/{d}".lstrip("/"))

    walk("")
    return found


def sweep():
    return artifacts.clean_artifacts(1000).deleted


def test_upload_stages_and_the_successful_report_publishes(world, claimed):
    job, claim = claimed
    agent = world.agent_caller()
    data = b"PK\x03\x04" + b"z" * 5000
    r = upload(agent, job.id, claim, "build.zip", data)
    assert r.status_code == 201
    assert r.json() == {"name": "build.zip", "size": len(data),
                        "sha256": hashlib.sha256(data).hexdigest(), "attempt": 1,
                        "content_type": "application/zip"}
    assert listed(world, job.id) == {}  # staged: visible to no one yet
    assert world.producer().get(f"jobs/{job.id}/artifacts/build.zip").status_code == 404
    assert report(agent, job.id, claim).status_code == 200
    assert listed(world, job.id)["build.zip"]["sha256"] == hashlib.sha256(data).hexdigest()
    got = world.producer().get(f"jobs/{job.id}/artifacts/build.zip")
    assert got.status_code == 200 and b"".join(got.streaming_content) == data
    assert got["Content-Length"] == str(len(data))
    assert got["ETag"] == f'"{hashlib.sha256(data).hexdigest()}"'
    assert got["Content-Type"] == "application/octet-stream"
    assert got["Content-Disposition"] == 'attachment; filename="build.zip"'
    assert got["X-Content-Type-Options"] == "nosniff"
    again = world.producer().get(f"jobs/{job.id}/artifacts/build.zip",
                                 headers={"If-None-Match": got["ETag"]})
    assert again.status_code == 304 and again["ETag"] == got["ETag"]


def test_the_same_name_again_replaces_it_and_the_old_file_is_deleted(world, claimed):
    job, claim = claimed
    agent = world.agent_caller()
    upload(agent, job.id, claim, "out.txt", b"first")
    r = upload(agent, job.id, claim, "out.txt", b"second!", content_type="text/html")
    assert r.status_code == 201 and r.json()["size"] == 7
    assert len(stored_files()) == 1 and sweep() == 0  # the first file went with the 201
    report(agent, job.id, claim)
    assert listed(world, job.id)["out.txt"]["content_type"] == "text/html"
    got = world.producer().get(f"jobs/{job.id}/artifacts/out.txt")
    assert b"".join(got.streaming_content) == b"second!"
    assert got["Content-Type"] == "application/octet-stream"  # never the stored type


class FlakyDeleteStorage(FileSystemStorage):
    """The filesystem, except that deleting fails while `failing` is set (a storage outage)."""

    failing = False

    def delete(self, name):
        if FlakyDeleteStorage.failing:
            raise OSError("storage unavailable")
        super().delete(name)


def test_a_replaced_file_the_storage_cannot_delete_yet_goes_at_clean_up(world, claimed,
                                                                       settings, tmp_path,
                                                                       caplog):
    settings.STORAGES = {**settings.STORAGES, "artifacts": {
        "BACKEND": f"{__name__}.FlakyDeleteStorage",
        "OPTIONS": {"location": str(tmp_path / "artifacts")}}}
    job, claim = claimed
    agent = world.agent_caller()
    upload(agent, job.id, claim, "out.txt", b"first")
    FlakyDeleteStorage.failing = True
    try:
        r = upload(agent, job.id, claim, "out.txt", b"second!")
    finally:
        FlakyDeleteStorage.failing = False
    assert r.status_code == 201 and r.json()["size"] == 7  # the upload itself succeeded
    assert "could not delete the replaced file" in caplog.text
    assert sorted(JobArtifact.objects.values_list("state", flat=True)) == ["replaced",
                                                                          "staged"]
    assert len(stored_files()) == 2
    assert sweep() == 1
    assert len(stored_files()) == 1
    assert JobArtifact.objects.get().state == "staged"


def test_seed_004_a_stale_attempt_can_never_overwrite_the_winning_set(world, claimed):
    job, claim1 = claimed
    agent = world.agent_caller()
    # Attempt 1 uploads, then is reaped.
    assert upload(agent, job.id, claim1, "result.bin", b"attempt one").status_code == 201
    JobClaim.objects.filter(job=job).update(claim_expires_at=NowPlusSeconds(-1))
    assert lifecycle.reap_expired_claims_once(10).requeued == 1
    # Attempt 2 uploads and wins.
    grant2 = lifecycle.claim_job(world.agent, job.id)
    claim2 = str(grant2.claim_id)
    assert upload(agent, job.id, claim2, "result.bin", b"attempt two").status_code == 201
    assert report(agent, job.id, claim2).status_code == 200
    # Attempt 1's late upload is refused, and so is its late report.
    late = upload(agent, job.id, claim1, "result.bin", b"late one")
    assert late.status_code == 409 and late.json()["code"] == "job_finished"
    assert upload(agent, job.id, claim1, "extra.bin", b"x").status_code == 409
    assert report(agent, job.id, claim1).status_code == 409
    # Only attempt 2's set is ever listed.
    assert {n: (a["attempt"], a["size"]) for n, a in listed(world, job.id).items()} == {
        "result.bin": (2, 11)}
    got = world.producer().get(f"jobs/{job.id}/artifacts/result.bin")
    assert b"".join(got.streaming_content) == b"attempt two"
    # Attempt 1's staged file is deleted by clean-up; the late ones were never kept.
    assert len(stored_files()) == 2
    assert sweep() == 1
    assert stored_files() == [JobArtifact.objects.get(attempt=2).storage_key]
    assert listed(world, job.id)["result.bin"]["attempt"] == 2


@pytest.mark.parametrize("status", ["failure", "cancelled"])
def test_another_final_status_publishes_nothing(world, claimed, status):
    job, claim = claimed
    agent = world.agent_caller()
    upload(agent, job.id, claim, "a.txt", b"a")
    assert report(agent, job.id, claim, status).status_code == 200
    assert listed(world, job.id) == {}
    assert sweep() == 1 and stored_files() == []


def test_the_batch_report_publishes_too(world, claimed):
    job, claim = claimed
    other = JobFactory(job_agent=world.agent)
    claim_b = str(lifecycle.claim_job(world.agent, other.id).claim_id)
    agent = world.agent_caller()
    upload(agent, job.id, claim, "a.txt", b"a")
    upload(agent, other.id, claim_b, "b.txt", b"b")
    r = agent.post(f"job-agents/{world.agent.id}/reports", json={"reports": [
        {"job_id": str(job.id), "claim_id": claim, "status": "successful"},
        {"job_id": str(other.id), "claim_id": claim_b, "status": "failure"}]})
    assert r.status_code == 200 and all(x["accepted"] for x in r.json()["results"])
    assert set(listed(world, job.id)) == {"a.txt"}
    assert listed(world, other.id) == {}


def test_a_requeue_after_success_keeps_the_old_set_until_the_next_success(world, claimed):
    job, claim = claimed
    agent = world.agent_caller()
    upload(agent, job.id, claim, "old.txt", b"old")
    report(agent, job.id, claim)
    lifecycle.requeue_job(job.id)
    assert set(listed(world, job.id)) == {"old.txt"}
    claim2 = str(lifecycle.claim_job(world.agent, job.id).claim_id)
    upload(agent, job.id, claim2, "new.txt", b"new")
    assert set(listed(world, job.id)) == {"old.txt"}
    report(agent, job.id, claim2)
    assert set(listed(world, job.id)) == {"new.txt"}
    assert sweep() == 1 and len(stored_files()) == 1


@pytest.mark.parametrize("name", ["..", ".", "a" * 201, "a b", "x%2Fy", "na\u00efve", "a:b"])
def test_bad_names_are_400_and_keep_nothing(world, claimed, name):
    job, claim = claimed
    r = upload(world.agent_caller(), job.id, claim, name, b"data")
    assert r.status_code in (400, 404), r.content
    if r.status_code == 400:
        assert r.json()["code"] == "validation_error" and "name" in r.json()["fields"]
    assert not JobArtifact.objects.exists() and stored_files() == []


@pytest.mark.parametrize("claim", [None, "nope"])
def test_a_missing_claim_id_is_400(world, claimed, claim):
    job, _ = claimed
    r = upload(world.agent_caller(), job.id, claim, "a.txt", b"data")
    assert r.status_code == 400 and "X-Claim-Id" in r.json()["fields"]
    assert not JobArtifact.objects.exists()


def test_a_stale_claim_is_409_and_keeps_nothing(world, claimed):
    job, claim = claimed
    lifecycle.cancel_job(job.id)
    r = upload(world.agent_caller(), job.id, claim, "a.txt", b"data")
    assert r.status_code == 409 and r.json()["code"] == "job_cancelled"
    assert not JobArtifact.objects.exists() and stored_files() == []


def test_caps_per_artifact_per_attempt_in_bytes_and_files(world, claimed, settings):
    job, claim = claimed
    agent = world.agent_caller()
    settings.JOBQUEUE = {**settings.JOBQUEUE, "MAX_ARTIFACT_BYTES": 10,
                         "MAX_ATTEMPT_ARTIFACT_BYTES": 15, "MAX_ARTIFACTS_PER_ATTEMPT": 2}
    r = upload(agent, job.id, claim, "big", b"x" * 11)
    assert r.status_code == 413 and r.json()["code"] == "output_too_large"
    assert upload(agent, job.id, claim, "a", b"x" * 10).status_code == 201
    r = upload(agent, job.id, claim, "b", b"x" * 6)  # 16 bytes in the attempt
    assert r.status_code == 413
    assert upload(agent, job.id, claim, "b", b"x" * 5).status_code == 201
    assert upload(agent, job.id, claim, "a", b"y" * 10).status_code == 201  # a replace
    assert upload(agent, job.id, claim, "c", b"z").status_code == 413  # a third file
    assert sorted(JobArtifact.objects.filter(state="staged").values_list("name", flat=True)) \
        == ["a", "b"]
    sweep()
    assert len(stored_files()) == 2


def test_a_body_longer_than_declared_cap_is_refused_while_streaming(claimed, settings):
    from io import BytesIO

    from jobqueue.exceptions import OutputTooLarge

    job, claim = claimed
    settings.JOBQUEUE = {**settings.JOBQUEUE, "MAX_ARTIFACT_BYTES": 100_000}
    with pytest.raises(OutputTooLarge):
        artifacts.upload_artifact(job.id, claim, "x", BytesIO(b"x" * 200_000))
    with pytest.raises(OutputTooLarge):  # a declared length over the cap: refused at once
        artifacts.upload_artifact(job.id, claim, "x", BytesIO(b"x"), declared_size=100_001)
    assert not JobArtifact.objects.exists() and stored_files() == []


def test_a_crash_between_staging_and_publication_publishes_nothing_and_is_cleaned(world,
                                                                               claimed):
    job, claim = claimed
    agent = world.agent_caller()
    upload(agent, job.id, claim, "a.txt", b"a")
    # A crash during an upload's transfer: its row is still `uploading`.
    JobArtifact.objects.create(job=job, attempt=1, claim_id=claim, name="b.txt",
                               storage_key=f"{job.id}/1/crashed/b.txt")
    artifacts.artifact_storage().save(f"{job.id}/1/crashed/b.txt",
                                      __import__("io").BytesIO(b"partial"))
    assert sweep() == 0  # the claim is live: nothing is garbage yet
    # The agent dies; its claim is reaped.
    JobClaim.objects.filter(job=job).update(claim_expires_at=NowPlusSeconds(-1))
    lifecycle.reap_expired_claims_once(10)
    assert listed(world, job.id) == {}
    assert artifacts.clean_artifacts(1, dry_run=True).deleted == 2
    result = artifacts.clean_artifacts(1)  # bounded batches of one
    assert (result.deleted, result.batches) == (2, 2)
    assert not JobArtifact.objects.exists() and stored_files() == []


def test_another_agents_or_workspaces_artifacts_are_404(world, claimed):
    job, claim = claimed
    agent = world.agent_caller()
    upload(agent, job.id, claim, "a.txt", b"a")
    report(agent, job.id, claim)
    other = world.agent_caller(world.other_token)
    assert upload(other, job.id, claim, "b.txt", b"b").status_code == 404
    assert other.get(f"jobs/{job.id}/artifacts/a.txt").status_code == 404
    assert agent.get(f"jobs/{job.id}/artifacts/a.txt").status_code == 403  # producers only
    from .conftest import Caller

    foreign = Caller(world.other_workspace.id, {"X-API-Key": world.other_key})
    assert foreign.get(f"jobs/{job.id}/artifacts").status_code == 404
    assert foreign.get(f"jobs/{job.id}/artifacts/a.txt").status_code == 404
    assert world.producer().get(f"jobs/{job.id}/artifacts/missing.txt").status_code == 404
    assert world.producer().get(f"jobs/{job.id}/artifacts/..").status_code == 404
    assert world.producer().get(f"jobs/{job.id}/artifacts/a%20b").status_code == 404


def test_media_types_are_kept_as_plain_type_slash_subtype_only(world, claimed):
    job, claim = claimed
    agent = world.agent_caller()
    upload(agent, job.id, claim, "a", b"a", content_type="text/plain; charset=utf-8")
    upload(agent, job.id, claim, "b", b"b", content_type="<script>")
    report(agent, job.id, claim)
    got = listed(world, job.id)
    assert got["a"]["content_type"] == "text/plain"
    assert got["b"]["content_type"] == "application/octet-stream"


def test_the_clean_artifacts_command(world, claimed):
    import json

    from django.core.management import CommandError, call_command

    job, claim = claimed
    agent = world.agent_caller()
    for name in ("a", "b", "c"):
        upload(agent, job.id, claim, name, b"x")
    lifecycle.release_job(job.id, claim)
    out = __import__("io").StringIO()
    call_command("clean_artifacts", "--dry-run", stdout=out)
    assert out.getvalue().strip() == "would delete 3 artifact(s) in 0 batch(es)"
    out = __import__("io").StringIO()
    call_command("clean_artifacts", "--batch-size", "2", "--max-batches", "1", "--json",
                 stdout=out)
    assert json.loads(out.getvalue()) == {"deleted": 2, "batches": 1, "dry_run": False}
    out = __import__("io").StringIO()
    call_command("clean_artifacts", stdout=out)
    assert out.getvalue().strip() == "deleted 1 artifact(s) in 1 batch(es)"
    assert stored_files() == []
    for bad in (["--batch-size", "0"], ["--max-batches", "0"]):
        with pytest.raises(CommandError):
            call_command("clean_artifacts", *bad)


def test_the_upload_stream_by_how_the_body_comes(world, claimed):
    import io

    from django.test import RequestFactory
    from rest_framework.exceptions import ValidationError

    from agents.bodies import IncompleteBody
    from agents.views.outputs import LengthRequired, upload_stream

    rf = RequestFactory()
    request = rf.put("/x", data=b"abc", content_type="application/octet-stream")
    stream, size = upload_stream(request)
    assert size == 3 and stream.read(10) == b"abc" and stream.read(10) == b""
    short = rf.put("/x", data=b"abc", content_type="application/octet-stream")
    short.META["CONTENT_LENGTH"] = "5"  # the client stopped after 3 of 5 bytes
    stream, size = upload_stream(short)
    assert size == 5 and stream.read(10) == b"abc"
    with pytest.raises(IncompleteBody):
        stream.read(10)
    request.META["CONTENT_LENGTH"] = "3x"
    with pytest.raises(ValidationError):
        upload_stream(request)
    chunked = rf.put("/x", HTTP_TRANSFER_ENCODING="chunked")
    chunked.META.pop("CONTENT_LENGTH", None)
    with pytest.raises(LengthRequired):  # a server that cannot tell where the body ends
        upload_stream(chunked)
    chunked.META["wsgi.input_terminated"] = True
    chunked.META["wsgi.input"] = io.BytesIO(b"streamed")
    stream, size = upload_stream(chunked)
    assert size is None and stream.read() == b"streamed"
    empty = rf.put("/x")
    empty.META.pop("CONTENT_LENGTH", None)
    stream, size = upload_stream(empty)
    assert size == 0 and stream.read(10) == b""


def test_an_agent_key_of_the_workspace_may_upload_and_an_empty_file_is_fine(world, claimed):
    job, claim = claimed
    r = upload(world.producer(), job.id, claim, "empty.txt", b"")
    assert r.status_code == 201 and r.json()["size"] == 0
    assert r.json()["sha256"] == hashlib.sha256(b"").hexdigest()


def test_downloads_take_one_byte_range(world, claimed):
    job, claim = claimed
    agent = world.agent_caller()
    upload(agent, job.id, claim, "a.bin", b"0123456789")
    upload(agent, job.id, claim, "empty", b"")
    report(agent, job.id, claim)
    producer = world.producer()

    def get(rng, name="a.bin"):
        return producer.get(f"jobs/{job.id}/artifacts/{name}", headers={"Range": rng})

    for rng, body, content_range in [("bytes=2-4", b"234", "bytes 2-4/10"),
                                     ("bytes=7-", b"789", "bytes 7-9/10"),
                                     ("bytes=-3", b"789", "bytes 7-9/10"),
                                     ("bytes=-30", b"0123456789", "bytes 0-9/10"),
                                     ("bytes=8-100", b"89", "bytes 8-9/10")]:
        r = get(rng)
        assert r.status_code == 206, rng
        assert b"".join(r.streaming_content) == body
        assert r["Content-Range"] == content_range and r["Content-Length"] == str(len(body))
    for rng in ("Bytes=2-4", "bytes=2-4, ", "bytes=0000000000000000000002-4"):
        r = get(rng)  # the unit in any case; empty list elements; leading zeros
        assert r.status_code == 206 and r["Content-Range"] == "bytes 2-4/10", rng
    r = get("bytes=2-99999999999999999999999")  # past any size: to the end
    assert r.status_code == 206 and r["Content-Range"] == "bytes 2-9/10"
    for rng in ("bytes=10-", "bytes=-0", "bytes=99999999999999999999999-"):
        r = get(rng)
        assert r.status_code == 416 and r["Content-Range"] == "bytes */10", rng
    assert get("bytes=-1", "empty").status_code == 416
    # Ignored (RFC 9110: an invalid range, another unit, several ranges): all of it, 200.
    for rng in ("bytes=5-3", "bytes=-", "items=1-2", "bytes=1-2,4-5", "x" * 50,
                "bytes=\u0663-4", "bytes=1 - 2", "bytes 1-2"):
        r = get(rng)
        assert r.status_code == 200 and b"".join(r.streaming_content) == b"0123456789", rng
        assert r["Accept-Ranges"] == "bytes" and r["Content-Length"] == "10"


def test_conditional_downloads_follow_rfc_9110(world, claimed):
    """If-None-Match by weak comparison (`*`, lists, `W/` tags: 304), evaluated before Range;
    If-Range by strong comparison (a match: the range; anything else: the whole file)."""
    job, claim = claimed
    agent = world.agent_caller()
    upload(agent, job.id, claim, "a.bin", b"0123456789")
    report(agent, job.id, claim)
    etag = f'"{hashlib.sha256(b"0123456789").hexdigest()}"'
    producer = world.producer()

    def get(**headers):
        return producer.get(f"jobs/{job.id}/artifacts/a.bin",
                            headers={k.replace("_", "-"): v for k, v in headers.items()})

    for inm in (etag, "*", f"W/{etag}", f'"other", {etag}', f' "x,y" , W/{etag} '):
        r = get(If_None_Match=inm, Range="bytes=0-1")
        assert r.status_code == 304 and r["ETag"] == etag, inm
        assert r.content == b"" and "Content-Range" not in r
        r = producer.request("HEAD", f"jobs/{job.id}/artifacts/a.bin",
                             headers={"If-None-Match": inm})
        assert r.status_code == 304, inm
    for inm in ('"other"', "W/\"other\"", etag.strip('"'), ""):
        r = get(If_None_Match=inm)
        assert r.status_code == 200 and b"".join(r.streaming_content) == b"0123456789", inm
    r = get(If_Range=etag, Range="bytes=2-4")
    assert r.status_code == 206 and b"".join(r.streaming_content) == b"234"
    for if_range in (f"W/{etag}", '"other"', "Fri, 04 Dec 2026 04:00:00 GMT"):
        r = get(If_Range=if_range, Range="bytes=2-4")
        assert r.status_code == 200 and b"".join(r.streaming_content) == b"0123456789"
        assert "Content-Range" not in r
    r = get(If_Range='"other"', Range="bytes=20-")  # not the current file: all of it
    assert r.status_code == 200


def test_the_counted_body_fills_each_read_from_short_reads():
    from jobqueue.lifecycle.artifacts import PIECE, _Counted

    class Trickle:
        def __init__(self, data):
            self.data = data

        def read(self, n):
            piece, self.data = self.data[:min(n, 1000)], self.data[min(n, 1000):]
            return piece

    body = _Counted(Trickle(b"x" * (3 * PIECE + 5)), cap=10 * PIECE)
    assert not body.seekable()
    assert len(body.read(2 * PIECE)) == 2 * PIECE  # a full part, from 1000-byte reads
    assert len(body.read()) == PIECE
    assert body.read(10 * PIECE) == b"x" * 5 and body.read(10) == b""
    assert body.size == 3 * PIECE + 5
    assert body.hash.hexdigest() == hashlib.sha256(b"x" * (3 * PIECE + 5)).hexdigest()


def test_head_answers_as_get_without_a_body_and_never_writes(world, claimed):
    """HEAD on the upload URL, with an X-Claim-Id and all, is a download's headers: the
    staged file stays as it was (HEAD once ran the upload and staged an empty file)."""
    job, claim = claimed
    agent = world.agent_caller()
    assert upload(agent, job.id, claim, "a.bin", b"0123456789").status_code == 201
    staged = JobArtifact.objects.get(state="staged")
    r = agent.request("HEAD", f"jobs/{job.id}/artifacts/a.bin", headers={"X-Claim-Id": claim})
    assert r.status_code == 403  # as a GET by the agent: producers only
    assert list(JobArtifact.objects.values_list("pk", "state", "size")) == [
        (staged.pk, "staged", 10)]
    report(agent, job.id, claim)
    producer = world.producer()
    for headers, status, length in [({}, 200, "10"), ({"Range": "bytes=2-4"}, 206, "3"),
                                    ({"X-Claim-Id": claim}, 200, "10")]:
        r = producer.request("HEAD", f"jobs/{job.id}/artifacts/a.bin", headers=headers)
        assert r.status_code == status, headers
        assert r["Content-Length"] == length and r.content == b""
        assert r["ETag"] == f'"{staged.sha256}"' and r["Accept-Ranges"] == "bytes"
    assert listed(world, job.id)["a.bin"]["size"] == 10
    assert stored_files() == [staged.storage_key]
    got = producer.get(f"jobs/{job.id}/artifacts/a.bin")
    assert b"".join(got.streaming_content) == b"0123456789"


def test_replacing_a_file_deletes_the_old_one_at_once_and_the_cap_holds(world, claimed,
                                                                       settings):
    """15 replacements of a 1 KiB `a` under a 3 KiB attempt cap: each is accepted (the
    attempt stages one file), and the replaced file is gone when the 201 answers, so the
    attempt never holds more than its cap on disk (replaced files once stayed until the
    cleaner ran: 15 of them here)."""
    job, claim = claimed
    agent = world.agent_caller()
    settings.JOBQUEUE = {**settings.JOBQUEUE, "MAX_ATTEMPT_ARTIFACT_BYTES": 3 * 1024}
    for i in range(15):
        r = upload(agent, job.id, claim, "a", bytes([i]) * 1024)
        assert r.status_code == 201, r.content
        assert len(stored_files()) == 1
        assert JobArtifact.objects.count() == 1
    assert upload(agent, job.id, claim, "b", b"b" * 1024).status_code == 201
    assert upload(agent, job.id, claim, "c", b"c" * 1024).status_code == 201
    r = upload(agent, job.id, claim, "d", b"d")
    assert r.status_code == 413 and r.json()["code"] == "output_too_large"
    assert len(stored_files()) == 3 and sweep() == 0
    report(agent, job.id, claim)
    got = world.producer().get(f"jobs/{job.id}/artifacts/a")
    assert b"".join(got.streaming_content) == bytes([14]) * 1024
