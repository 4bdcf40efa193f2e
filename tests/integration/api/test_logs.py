"""PATCH/GET jobs/{id}/log: GitLab's trace protocol per attempt (repeats accepted, gaps 416
with the length), the cap, the grace period after a cancel or supersede, live reads by offset.
In-process client (the whole Django/DRF stack)."""

import pytest

from jobqueue import lifecycle
from jobqueue.db import NowPlusSeconds
from jobqueue.models import JobClaim, JobEvent, JobLog, JobLogChunk
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def claimed(world):
    job = JobFactory(job_agent=world.agent, dispatch_context={"token": "s3cr3t-value"})
    grant = lifecycle.claim_job(world.agent, job.id)
    return job, str(grant.claim_id)


def patch(caller, job_id, claim_id, data: bytes, content_range=None, **headers):
    if claim_id is not None:
        headers["X-Claim-Id"] = claim_id
    if content_range is not None:
        headers["Content-Range"] = content_range
    return caller.request("PATCH", f"jobs/{job_id}/log", raw=data, content_type="text/plain",
                          headers=headers)


def read(caller, job_id, query=""):
    return caller.get(f"jobs/{job_id}/log{query}")


def test_chunks_append_in_order_and_read_from_an_offset(world, claimed):
    job, claim = claimed
    agent = world.agent_caller()
    r = patch(agent, job.id, claim, b"hello ", "bytes 0-5/*")
    assert r.status_code == 202 and r.json() == {"attempt": 1, "length": 6}
    assert r["Range"] == "0-6"
    r = patch(agent, job.id, claim, b"world\n", "6-11")  # GitLab runner's form
    assert r.status_code == 202 and r.json()["length"] == 12
    got = read(world.producer(), job.id)
    assert got.status_code == 200 and got.content == b"hello world\n"
    assert got["Content-Type"].startswith("text/plain")
    assert got["X-Log-Length"] == "12" and got["X-Log-Attempt"] == "1"
    assert got["X-Content-Type-Options"] == "nosniff"
    assert read(world.producer(), job.id, "?offset=6").content == b"world\n"
    assert read(world.producer(), job.id, "?offset=3&attempt=1").content == b"lo world\n"
    assert read(world.producer(), job.id, "?offset=12").content == b""
    assert read(world.producer(), job.id, "?offset=99").content == b""
    # The agent may read its own job's log too.
    assert read(agent, job.id).content == b"hello world\n"
    assert JobLogChunk.objects.filter(log__job=job).count() == 2


def test_no_content_range_appends_at_the_end(world, claimed):
    job, claim = claimed
    agent = world.agent_caller()
    assert patch(agent, job.id, claim, b"a").json()["length"] == 1
    assert patch(agent, job.id, claim, b"bc").json()["length"] == 3
    assert patch(agent, job.id, claim, b"").json()["length"] == 3
    assert read(world.producer(), job.id).content == b"abc"


def test_a_repeated_chunk_is_accepted_unchanged_and_an_overlap_appends_the_rest(world, claimed):
    job, claim = claimed
    agent = world.agent_caller()
    patch(agent, job.id, claim, b"0123456789", "bytes 0-9/*")
    r = patch(agent, job.id, claim, b"0123456789", "bytes 0-9/*")  # a retry after a lost answer
    assert r.status_code == 202 and r.json()["length"] == 10
    r = patch(agent, job.id, claim, b"89AB", "bytes 8-11/*")
    assert r.status_code == 202 and r.json()["length"] == 12
    assert read(world.producer(), job.id).content == b"0123456789AB"
    assert JobLogChunk.objects.filter(log__job=job).count() == 2


def test_a_gap_is_416_with_the_current_length_and_changes_nothing(world, claimed):
    job, claim = claimed
    agent = world.agent_caller()
    patch(agent, job.id, claim, b"abc", "bytes 0-2/*")
    r = patch(agent, job.id, claim, b"xyz", "bytes 5-7/*")
    assert r.status_code == 416
    assert r.json()["code"] == "log_range_gap" and r["Range"] == "0-3"
    assert read(world.producer(), job.id).content == b"abc"


@pytest.mark.parametrize("header", ["bytes 0-9/*", "bytes=a-b", "5-1", "-3", "0-1/x", "x" * 40])
def test_a_bad_content_range_is_400_and_changes_nothing(world, claimed, header):
    job, claim = claimed
    r = patch(world.agent_caller(), job.id, claim, b"abc", header)
    assert r.status_code == 400 and r.json()["code"] == "validation_error"
    assert "Content-Range" in r.json()["fields"]
    assert header not in r.content.decode() or header in ("-3",)
    assert not JobLog.objects.filter(job=job).exists()


@pytest.mark.parametrize("claim", [None, "not-a-uuid"])
def test_a_missing_or_malformed_claim_id_is_400(world, claimed, claim):
    job, _ = claimed
    r = patch(world.agent_caller(), job.id, claim, b"abc")
    assert r.status_code == 400 and "X-Claim-Id" in r.json()["fields"]
    assert "not-a-uuid" not in r.content.decode()
    assert not JobLog.objects.exists()


def test_the_cap_refuses_a_chunk_that_would_pass_it_and_keeps_nothing_of_it(world, claimed,
                                                                             settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "MAX_LOG_BYTES": 10}
    job, claim = claimed
    agent = world.agent_caller()
    assert patch(agent, job.id, claim, b"12345678").status_code == 202
    r = patch(agent, job.id, claim, b"abc")
    assert r.status_code == 413 and r.json()["code"] == "output_too_large"
    assert r["Range"] == "0-8"
    assert patch(agent, job.id, claim, b"ab").status_code == 202  # exactly the cap
    assert read(world.producer(), job.id).content == b"12345678ab"


def test_invalid_query_is_400(world, claimed):
    job, _ = claimed
    for query in ("?offset=-1", "?attempt=x", "?offset=" + "9" * 20):
        r = read(world.producer(), job.id, query)
        assert r.status_code == 400 and r.json()["code"] == "validation_error", query


def test_a_job_without_a_log_reads_empty(world):
    job = JobFactory(job_agent=world.agent)
    r = read(world.producer(), job.id)
    assert r.status_code == 200 and r.content == b"" and r["X-Log-Length"] == "0"
    assert r["X-Log-Attempt"] == "0"
    assert read(world.producer(), job.id, "?attempt=3")["X-Log-Attempt"] == "3"


def test_logs_are_per_attempt(world, claimed):
    job, claim1 = claimed
    agent = world.agent_caller()
    patch(agent, job.id, claim1, b"first try\n")
    lifecycle.release_job(job.id, claim1)
    grant = lifecycle.claim_job(world.agent, job.id)
    r = patch(agent, job.id, str(grant.claim_id), b"second", "bytes 0-5/*")
    assert r.json() == {"attempt": 2, "length": 6}
    producer = world.producer()
    assert read(producer, job.id).content == b"second"  # the latest attempt's
    assert read(producer, job.id)["X-Log-Attempt"] == "2"
    assert read(producer, job.id, "?attempt=1").content == b"first try\n"


@pytest.mark.parametrize("end", ["cancel", "requeue", "reap"])
def test_the_holder_may_append_during_the_grace_period_after_its_claim_ends(world, claimed,
                                                                            end):
    job, claim = claimed
    agent = world.agent_caller()
    patch(agent, job.id, claim, b"working\n")
    if end == "cancel":
        lifecycle.cancel_job(job.id)
    elif end == "requeue":
        lifecycle.requeue_job(job.id)
    else:
        JobClaim.objects.filter(job=job).update(claim_expires_at=NowPlusSeconds(-1))
        assert lifecycle.reap_expired_claims_once(10).reaped == 1
    r = patch(agent, job.id, claim, b"last lines\n")
    assert r.status_code == 202 and r.json() == {"attempt": 1, "length": 19}
    # ...but it can publish nothing: its report is refused.
    r = agent.put(f"jobs/{job.id}/status", json={"claim_id": claim, "status": "successful"})
    assert r.status_code == 409
    # After the grace period (by the database's clock), its appends are refused like any
    # stale write, and recorded.
    JobEvent.objects.filter(job=job, claim_id=claim).update(created_at=NowPlusSeconds(-31))
    r = patch(agent, job.id, claim, b"too late\n")
    assert r.status_code == 409
    assert r.json()["code"] == ("job_cancelled" if end == "cancel" else "claim_superseded")
    assert read(world.producer(), job.id, "?attempt=1").content == b"working\nlast lines\n"
    refused = JobEvent.objects.filter(job=job, kind=JobEvent.STALE_WRITE_REFUSED)
    assert [e.detail for e in refused] == [
        {"operation": "status", "code": r.json()["code"]},
        {"operation": "log", "code": r.json()["code"]},
    ]


def test_a_claim_that_never_held_the_job_is_refused(world, claimed):
    job, _ = claimed
    r = patch(world.agent_caller(), job.id, "00000000-0000-4000-8000-000000000000", b"x")
    assert r.status_code == 409 and r.json()["code"] == "claim_superseded"
    assert not JobLog.objects.exists()


def test_another_agents_or_workspaces_job_is_404(world, claimed):
    job, claim = claimed
    other = world.agent_caller(world.other_token)
    assert patch(other, job.id, claim, b"x").status_code == 404
    assert read(other, job.id).status_code == 404
    from .conftest import Caller

    foreign = Caller(world.other_workspace.id, {"X-API-Key": world.other_key})
    assert read(foreign, job.id).status_code == 404
    assert patch(foreign, job.id, claim, b"x").status_code == 404
    assert not JobLog.objects.exists()


def test_the_log_never_holds_the_dispatch_context(world, claimed):
    job, claim = claimed
    patch(world.agent_caller(), job.id, claim, b"line\n")
    assert b"s3cr3t-value" not in read(world.producer(), job.id).content


def test_head_answers_as_get_without_a_body_and_never_appends(world, claimed):
    job, claim = claimed
    agent = world.agent_caller()
    patch(agent, job.id, claim, b"hello world\n")
    r = agent.request("HEAD", f"jobs/{job.id}/log?offset=6", headers={"X-Claim-Id": claim,
                                                                     "Content-Length": "0"})
    assert r.status_code == 200 and r.content == b""
    assert (r["X-Log-Length"], r["X-Log-Attempt"], r["Content-Length"]) == ("12", "1", "6")
    assert world.producer().request("HEAD", f"jobs/{job.id}/log?offset=99")[
        "Content-Length"] == "0"
    assert JobLogChunk.objects.filter(log__job=job).count() == 1
    assert read(world.producer(), job.id).content == b"hello world\n"
    assert not JobEvent.objects.filter(job=job, kind="refused").exists()
