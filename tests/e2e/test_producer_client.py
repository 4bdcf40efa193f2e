"""The producer client (jobqueue_client.producer.ProducerClient) against a real server: a job's
whole life driven from both sides, the producer with its workspace API key and an agent with
AgentClient, every request over real HTTP to gunicorn on the test database. What the producer
sees is checked against what the agent did (and, where it matters, against the database)."""

import datetime as dt
import hashlib
import io
import json
import threading
import time
import uuid

import httpx
import pytest
from jobqueue_client import (
    AgentClient,
    AuthError,
    ChecksumMismatch,
    Conflict,
    GroupCancelled,
    IdempotencyKeyReused,
    InvalidRequest,
    InvalidTransition,
    JobFinished,
    LeaseLost,
    NotFound,
    ProducerClient,
    TransportError,
    UniqueKeyConflict,
    WaitTimeout,
)

from agents import credentials
from jobqueue import states
from jobqueue.models import Job, JobAgent, JobEvent, Workspace

from .harness import Stack, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


class Recorder(httpx.BaseTransport):
    """Forwards every request to the real server and records (method, path, query)."""

    def __init__(self):
        self.inner = httpx.HTTPTransport()
        self.seen: list[tuple[str, str, dict]] = []
        self.lock = threading.Lock()

    def handle_request(self, request):
        with self.lock:
            self.seen.append((request.method, request.url.path, dict(request.url.params)))
        return self.inner.handle_request(request)

    def close(self):
        self.inner.close()


def server(tmp_path, **env):
    store = tmp_path / "artifacts"
    return Stack(tmp_path, server_env={
        "JOBQUEUE_ARTIFACT_STORAGE_OPTIONS": json.dumps({"location": str(store)}), **env})


@pytest.fixture
def stack(transactional_db, tmp_path):
    with server(tmp_path) as s:
        yield s


@pytest.fixture
def world(stack, make_agent):
    """A job agent with a long lease, its AgentClient, and a ProducerClient with a fresh
    workspace API key (recording its requests)."""
    agent, token = make_agent(lease_seconds=60)
    key = credentials.issue_workspace_api_key(agent.workspace)
    recorder = Recorder()
    producer = ProducerClient(stack.url, str(agent.workspace_id), key, transport=recorder)
    worker = AgentClient(stack.url, str(agent.workspace_id), str(agent.id), token, holder="")
    producer.recorder = recorder
    yield agent, producer, worker
    producer.close()
    worker.close()


def in_thread(fn, *args, **kwargs):
    """Run fn in a thread; returns (thread, box) where box gets "value" or "error", and
    "seconds" (how long the call took)."""
    box = {}

    def run():
        started = time.monotonic()
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # handed to the test
            box["error"] = exc
        box["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


def test_a_job_from_create_to_its_artifacts(world, tmp_path, say):
    agent, producer, worker = world
    expires_at = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(hours=1)
    fields = dict(job_agent_config={"command": ["make", "deploy"]},
                  dispatch_context={"db_password": "hunter2"}, priority=5, max_attempts=2,
                  retry_backoff_seconds=7, max_runtime_seconds=600, expires_at=expires_at,
                  external_id="deploy-42", group="release-42")
    job = producer.create_job(agent.id, idempotency_key="deploy-42-key", **fields)
    assert job["status"] == states.QUEUED and job["job_agent_id"] == str(agent.id)
    assert job["job_agent_config"] == {"command": ["make", "deploy"]}
    assert (job["priority"], job["max_attempts"], job["retry_backoff_seconds"],
            job["max_runtime_seconds"]) == (5, 2, 7, 600)
    assert dt.datetime.fromisoformat(job["expires_at"].replace("Z", "+00:00")) == expires_at
    assert (job["external_id"], job["group"], job["idempotency_key"]) == (
        "deploy-42", "release-42", "deploy-42-key")
    assert "dispatch_context" not in job
    # The key makes the create safe to repeat: the same fields answer the same job, other
    # fields are refused (and create nothing).
    assert producer.create_job(agent.id, idempotency_key="deploy-42-key", **fields)["id"] == \
        job["id"]
    with pytest.raises(IdempotencyKeyReused) as reused:
        producer.create_job(agent.id, idempotency_key="deploy-42-key", **{**fields,
                                                                           "priority": 6})
    assert (reused.value.status, reused.value.code) == (422, "idempotency_key_reused")
    assert Job.objects.filter(workspace_id=agent.workspace_id).count() == 1
    # The secret never comes back to the producer: only its key's name.
    detail = producer.get(job["id"])
    assert detail["dispatch_context_keys"] == ["db_password"] and "hunter2" not in str(detail)
    assert detail["claim"] is None and detail["events"][0]["kind"] == JobEvent.CREATED
    assert [j["id"] for j in producer.list(group="release-42")] == [job["id"]]
    assert [j["id"] for j in producer.list(status="queued")] == [job["id"]]
    assert list(producer.list(status="in_progress")) == []

    claim = worker.claim_next()
    assert claim.job_id == job["id"] and claim.job["dispatch_context"] == {
        "db_password": "hunter2"}
    running = producer.get(job["id"])
    assert running["status"] == states.IN_PROGRESS
    assert running["claim"]["attempt"] == 1 and running["claim"]["lease_state"] == "active"
    # A producer's long-poll is held while the agent works ...
    held, box = in_thread(producer.get, job["id"], wait_seconds=30)
    log = b"step 1\nstep 2\n"
    assert worker.append_log(claim.job_id, claim.claim_id, log, 0) == len(log)
    assert producer.read_log(job["id"]).data == log  # live, while the attempt runs
    blob = bytes(range(256)) * 4096 + b"tail"  # ~1 MiB, several download chunks
    report = b"all green\n"
    for name, data in (("blob.bin", blob), ("report.txt", report)):
        staged = worker.upload_artifact(claim.job_id, claim.claim_id, name, [data], len(data))
        assert staged["sha256"] == hashlib.sha256(data).hexdigest()
    assert producer.list_artifacts(job["id"]) == []  # staged: nobody sees them yet
    time.sleep(1)
    assert held.is_alive(), box
    # ... and answered by the agent's report, with the job as it ended.
    worker.report(claim.job_id, claim.claim_id, "successful", result={"deployed": "v42"})
    held.join(timeout=10)
    assert not held.is_alive() and "error" not in box, box
    assert box["value"]["status"] == states.SUCCESSFUL
    assert box["value"]["result"] == {"deployed": "v42"}
    assert 1 <= box["seconds"] < 15
    assert [a["outcome"] for a in box["value"]["attempts"]] == ["successful"]
    done = producer.wait(job["id"], timeout=5)  # already terminal: at once
    assert done["status"] == states.SUCCESSFUL and done["completed_at"]

    listed = {a["name"]: a for a in producer.list_artifacts(job["id"])}
    assert set(listed) == {"blob.bin", "report.txt"}
    assert listed["blob.bin"]["size"] == len(blob) and listed["blob.bin"]["attempt"] == 1
    target = tmp_path / "out" / "blob.bin"
    target.parent.mkdir()
    got = producer.download_artifact(job["id"], "blob.bin", target)
    assert got == {"name": "blob.bin", "size": len(blob), "sha256": listed["blob.bin"]["sha256"]}
    assert target.read_bytes() == blob
    assert sorted(p.name for p in target.parent.iterdir()) == ["blob.bin"]  # no .part left
    buffer = io.BytesIO()
    producer.download_artifact(job["id"], "report.txt", buffer)
    assert buffer.getvalue() == report
    with pytest.raises(NotFound) as missing:
        producer.download_artifact(job["id"], "nope.txt", tmp_path / "nope.txt")
    assert missing.value.code == "not_found" and not (tmp_path / "nope.txt").exists()

    whole = producer.read_log(job["id"])
    assert (whole.data, whole.attempt, whole.length) == (log, 1, len(log))
    rest = producer.read_log(job["id"], attempt=1, offset=7)
    assert (rest.text, rest.offset, rest.next_offset) == ("step 2\n", 7, len(log))
    assert producer.read_log(job["id"], attempt=2).data == b""
    say(f"held get answered by the report after {box['seconds']:.2f}s")


def test_a_corrupted_download_is_refused_and_leaves_no_file(world, tmp_path, stack):
    agent, producer, worker = world
    job = producer.create_job(agent.id)
    claim = worker.claim_next()
    worker.upload_artifact(claim.job_id, claim.claim_id, "a.txt", [b"original"], 8)
    worker.report(claim.job_id, claim.claim_id, "successful")
    # Someone changes the stored bytes behind the service's back.
    [stored] = [p for p in (tmp_path / "artifacts").rglob("a.txt")]
    stored.write_bytes(b"tampered")
    with pytest.raises(ChecksumMismatch) as bad:
        producer.download_artifact(job["id"], "a.txt", tmp_path / "a.txt")
    assert bad.value.code == "checksum_mismatch" and bad.value.transient
    assert not list(tmp_path.glob("*a.txt*")) and not list(tmp_path.glob(".a.txt*"))


def test_cancel_requeue_dispatch_and_their_refusals(world):
    agent, producer, worker = world
    job = producer.create_job(agent.id, job_agent_config={"n": 1})
    claim = worker.claim_next()
    cancelled = producer.cancel(job["id"], reason="wrong version")
    assert cancelled["status"] == states.CANCELLED
    # The holder's token stopped working: its next write is refused.
    with pytest.raises(LeaseLost) as lost:
        worker.heartbeat(claim.job_id, claim.claim_id)
    assert lost.value.code == "job_cancelled"
    again = producer.cancel(job["id"])  # a cancelled job's cancel answers it unchanged
    assert (again["status"], again["completed_at"]) == (states.CANCELLED,
                                                        cancelled["completed_at"])

    requeued = producer.requeue(job["id"], reason="try again")
    assert requeued["status"] == states.QUEUED
    second = worker.claim_next()
    assert (second.job_id, second.attempt) == (job["id"], 2)
    with pytest.raises(WaitTimeout) as running:  # it runs: wait() gives up at its timeout
        producer.wait(job["id"], timeout=1, poll_seconds=1)
    assert running.value.job["status"] == states.IN_PROGRESS
    worker.report(second.job_id, second.claim_id, "failure", message="exit 3")
    ended = producer.wait(job["id"], timeout=10)
    assert (ended["status"], ended["message"]) == (states.FAILURE, "exit 3")
    assert [a["outcome"] for a in ended["attempts"]] == ["cancelled", "failure"]
    kinds = [e["kind"] for e in ended["events"]]
    assert kinds.count(JobEvent.CANCELLED) == 1 and JobEvent.REQUEUED in kinds
    with pytest.raises(JobFinished) as finished:  # it ended otherwise: not cancelled now
        producer.cancel(job["id"])
    assert isinstance(finished.value, Conflict)
    assert (finished.value.status, finished.value.code) == (409, "job_finished")
    assert Job.objects.get(id=job["id"]).status == states.FAILURE

    held = producer.create_job(agent.id, hold=True)
    assert held["status"] == states.PENDING
    assert worker.claim_next() is None  # pending: not claimable
    with pytest.raises(InvalidTransition) as pending:
        producer.requeue(held["id"])
    assert (pending.value.status, pending.value.code) == (409, "invalid_transition")
    assert producer.dispatch(held["id"])["status"] == states.QUEUED
    with pytest.raises(InvalidTransition):
        producer.dispatch(held["id"])
    assert worker.claim_next().job_id == held["id"]

    # What is not in the workspace is a 404, a malformed id too; a bad field a 400.
    for missing in (str(uuid.uuid4()), "not-a-uuid"):
        with pytest.raises(NotFound) as nf:
            producer.get(missing)
        assert (nf.value.status, nf.value.code) == (404, "not_found")
        with pytest.raises(NotFound):
            producer.cancel(missing)
        with pytest.raises(NotFound):
            producer.list_artifacts(missing)
    with pytest.raises(InvalidRequest) as unknown:
        producer.create_job(str(uuid.uuid4()))
    assert unknown.value.status == 400 and "job_agent_id" in unknown.value.fields
    with pytest.raises(InvalidRequest) as bounds:
        producer.create_job(agent.id, max_attempts=0)
    assert "max_attempts" in bounds.value.fields
    with pytest.raises(InvalidRequest) as status:
        producer.list_page(status="done")
    assert status.value.code == "validation_error" and "status" in status.value.fields
    assert Job.objects.count() == 2  # the refused creates made nothing
    # Another workspace's key sees none of it; a wrong key is refused.
    other = credentials.issue_workspace_api_key(Workspace.objects.create(name="other"))
    with ProducerClient(producer.server, str(agent.workspace_id), other) as outsider:
        with pytest.raises(NotFound):
            outsider.get(job["id"])
    with ProducerClient(producer.server, str(agent.workspace_id), "jqk_nope_nope") as wrong:
        with pytest.raises(AuthError) as auth:
            wrong.get(job["id"])
    assert (auth.value.status, auth.value.code) == (401, "authentication_failed")


def test_groups_through_the_client(world):
    agent, producer, worker = world
    name = "nightly run #7?"  # a space, a '#' and a '?' travel percent-encoded
    jobs = [producer.create_job(agent.id, group=name, external_id=str(i)) for i in range(3)]
    state = producer.group(name)
    assert state["group"] == name and state["counts"][states.QUEUED] == 3
    assert state["finished"] is False and state["cancelled_at"] is None
    done = worker.claim_next()
    worker.report(done.job_id, done.claim_id, "successful")
    holding = worker.claim_next()
    assert producer.cancel_group(name, reason="aborted") == 2
    with pytest.raises(LeaseLost) as lost:
        worker.report(holding.job_id, holding.claim_id, "successful")
    assert lost.value.code == "job_cancelled"
    state = producer.group(name)
    assert state["finished"] is True and state["cancelled_at"]
    assert (state["counts"][states.CANCELLED], state["counts"][states.SUCCESSFUL]) == (2, 1)
    assert producer.cancel_group(name) == 0  # harmless to repeat
    with pytest.raises(GroupCancelled) as refused:
        producer.create_job(agent.id, group=name)
    assert (refused.value.status, refused.value.code) == (409, "group_cancelled")
    with pytest.raises(GroupCancelled):
        producer.requeue(done.job_id)
    statuses = {j["id"]: j["status"] for j in producer.list(group=name)}
    assert set(statuses) == {j["id"] for j in jobs}
    assert sorted(statuses.values()) == ["cancelled", "cancelled", "successful"]
    assert list(producer.list(group="nightly run #7")) == []  # the exact name only
    with pytest.raises(NotFound):
        producer.group("never-seen")
    with pytest.raises(NotFound):
        producer.cancel_group("never-seen")


def test_unique_jobs_through_the_client(world):
    agent, producer, worker = world
    first = producer.create_job(agent.id, unique_key="nightly", dispatch_context={"n": 1})
    assert first["deduplicated"] is False and first["unique_key"] == "nightly"
    again = producer.create_job(agent.id, unique_key="nightly", on_conflict="replace",
                                dispatch_context={"n": 2}, priority=3)
    assert again["deduplicated"] is True and again["id"] == first["id"]
    assert again["priority"] == 3
    claim = worker.claim_next()
    assert claim.job["id"] == first["id"] and claim.job["dispatch_context"] == {"n": 2}
    beside = producer.create_job(agent.id, unique_key="nightly", on_conflict="replace")
    assert beside["deduplicated"] is False and beside["id"] != first["id"]
    debounced = producer.create_job(agent.id, unique_key="nightly", debounce_seconds=60,
                                    debounce_max_seconds=120, dispatch_context={"n": 3})
    assert debounced["id"] == beside["id"] and debounced["deduplicated"] is True
    assert debounced["available_at"] > beside["available_at"]
    with pytest.raises(InvalidRequest) as bad:
        producer.create_job(agent.id, debounce_seconds=5)
    assert bad.value.status == 400 and "debounce_seconds" in bad.value.fields
    # A replace for another agent of the workspace meets this agent's job: refused, typed.
    other = JobAgent.objects.create(workspace=agent.workspace, name="e2e-other")
    with pytest.raises(UniqueKeyConflict) as refused:
        producer.create_job(other.id, unique_key="nightly", on_conflict="replace")
    assert (refused.value.status, refused.value.code) == (409, "unique_key_conflict")
    assert beside["id"] in refused.value.detail
    assert Job.objects.filter(unique_key="nightly").count() == 2


def test_dependencies_and_flows_through_the_client(world):
    """Seed 002's extract -> load as a flow: the load waits, its claim reads the extract's
    result; a failed extract cancels its load (dependency_failed)."""
    agent, producer, worker = world
    made = producer.create_flow([
        {"ref": "extract", "job_agent_id": str(agent.id), "dispatch_context": {"k": "e"}},
        {"ref": "load", "job_agent_id": str(agent.id), "depends_on_refs": ["extract"]}])
    assert list(made) == ["extract", "load"]
    assert made["load"]["status"] == "pending"
    assert made["load"]["waiting_on"] == [made["extract"]["id"]]
    extract = worker.claim_next()
    assert extract.job_id == made["extract"]["id"] and extract.parents == []
    worker.report(extract.job_id, extract.claim_id, "successful", result={"rows": 9})
    load = worker.claim_next()
    assert load.job_id == made["load"]["id"]
    assert load.parents == [{"job_id": extract.job_id, "status": "successful",
                             "result": {"rows": 9}}]
    worker.report(load.job_id, load.claim_id, "successful")
    parent = producer.create_job(agent.id)
    child = producer.create_job(agent.id, depends_on=[parent["id"]])
    assert child["status"] == "pending" and child["depends_on"] == [parent["id"]]
    producer.cancel(parent["id"])
    child = producer.get(child["id"])
    assert child["status"] == "cancelled"
    assert child["message"] == f"dependency_failed: {parent['id']}"
    with pytest.raises(InvalidRequest) as bad:
        producer.create_flow([{"ref": "a", "job_agent_id": str(agent.id),
                               "depends_on_refs": ["b"]}])
    assert bad.value.status == 400 and "jobs[0].depends_on_refs" in bad.value.fields


def test_list_follows_the_cursor_across_pages(world):
    agent, producer, worker = world
    ids = [producer.create_job(agent.id, external_id=f"n{i}")["id"] for i in range(7)]
    recorder = producer.recorder
    recorder.seen.clear()
    got = [j["id"] for j in producer.list(page_size=3)]
    assert got == ids[::-1]  # newest first, each once
    pages = [q for m, p, q in recorder.seen if m == "GET" and p.endswith("/jobs")]
    assert len(pages) == 3 and "cursor" not in pages[0] and all("cursor" in q for q in pages[1:])
    recorder.seen.clear()
    assert [j["id"] for j in producer.list(page_size=3, limit=4)] == ids[::-1][:4]
    assert len(recorder.seen) == 2  # no page beyond what the limit needs
    claim = worker.claim_next()
    worker.report(claim.job_id, claim.claim_id, "successful")
    assert [j["id"] for j in producer.list(status="successful")] == [claim.job_id]
    assert [j["id"] for j in producer.list(job_agent_id=agent.id, page_size=2)] == ids[::-1]
    # Another agent's jobs are filtered out by job_agent_id, not by the workspace.
    other = JobAgent.objects.create(workspace=agent.workspace, name="other")
    extra = producer.create_job(other.id)["id"]
    assert [j["id"] for j in producer.list(job_agent_id=other.id)] == [extra]
    assert len(list(producer.list())) == 8
    page = producer.list_page(page_size=5)
    assert len(page["results"]) == 5 and page["next"] and page["previous"] is None


def test_wait_halves_an_over_long_poll_times_out_and_aborts(transactional_db, tmp_path,
                                                             make_agent):
    with server(tmp_path, JOBQUEUE_MAX_CLAIM_WAIT_SECONDS=2) as stack:
        agent, token = make_agent(lease_seconds=60)
        key = credentials.issue_workspace_api_key(agent.workspace)
        recorder = Recorder()
        with ProducerClient(stack.url, str(agent.workspace_id), key, transport=recorder,
                            max_wait_seconds=8) as producer:
            job = producer.create_job(agent.id)
            with pytest.raises(InvalidRequest) as over:
                producer.get(job["id"], wait_seconds=3)
            assert over.value.code == "validation_error" and "wait_seconds" in over.value.fields
            # wait() asks for 5 s (its timeout, under its 8), then 4, then 2 (the server's
            # bound, which the client keeps), and gives up at its timeout with the job as it
            # last saw it.
            recorder.seen.clear()
            started = time.monotonic()
            with pytest.raises(WaitTimeout) as timed_out:
                producer.wait(job["id"], timeout=5)
            took = time.monotonic() - started
            assert isinstance(timed_out.value, TimeoutError)
            assert timed_out.value.job["status"] == states.QUEUED
            assert 5 <= took < 9, took
            waits = [int(q["wait_seconds"]) for m, p, q in recorder.seen if "wait_seconds" in q]
            assert waits[:3] == [5, 4, 2] and max(waits[3:]) <= 2, waits
            assert producer.max_wait_seconds == 2
            # Ended by the agent while wait() holds a poll.
            with AgentClient(stack.url, str(agent.workspace_id), str(agent.id), token,
                             holder="") as worker:
                waiter, box = in_thread(producer.wait, job["id"], timeout=30)
                time.sleep(0.5)
                claim = worker.claim_next()
                time.sleep(2.5)  # past one whole poll: wait() has polled again
                assert waiter.is_alive()
                worker.report(claim.job_id, claim.claim_id, "successful")
                waiter.join(timeout=10)
                assert box.get("value", {}).get("status") == states.SUCCESSFUL, box
                assert box["seconds"] < 10
            # abort_wait() ends a held poll at once, from another thread.
            second = producer.create_job(agent.id)
            waiter, box = in_thread(producer.wait, second["id"])
            wait_for(lambda: any(q.get("wait_seconds") and second["id"] in p
                                 for m, p, q in recorder.seen), 10, "the held poll")
            time.sleep(0.3)
            producer.abort_wait()
            waiter.join(timeout=5)
            assert not waiter.is_alive() and isinstance(box.get("error"), TransportError), box
            assert box["seconds"] < 5
            assert Job.objects.get(id=second["id"]).status == states.QUEUED
