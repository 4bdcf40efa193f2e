"""The producer's command line (`jobqueue`, the console script of jobqueue-client) against a
real server: every command runs as its own process, configured from JOBQUEUE_URL,
JOBQUEUE_WORKSPACE and JOBQUEUE_API_KEY, while a real `jobqueue-agent` runs the jobs it
creates. What the CLI prints and its exit status are checked against the database."""

import json
import os
import select
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from agents import credentials
from jobqueue import states
from jobqueue.models import Job, JobEvent

from .harness import ROOT, Stack, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

JOBQUEUE = str(Path(sys.executable).with_name("jobqueue"))  # the installed entry point


class Cli:
    """Runs `jobqueue` with the workspace's settings in its environment."""

    def __init__(self, stack: Stack, workspace_id, key: str):
        self.stack = stack
        self.env = stack.env(JOBQUEUE_URL=stack.url, JOBQUEUE_WORKSPACE=workspace_id,
                             JOBQUEUE_API_KEY=key)

    def argv(self, *args) -> list[str]:
        return [JOBQUEUE, *map(str, args)]

    def __call__(self, *args, input=None, timeout=120, **env) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(*args), cwd=ROOT, env={**self.env, **env}, input=input,
                              capture_output=True, text=True, timeout=timeout)

    def json(self, *args, **kw):
        out = self("--json", *args, **kw)
        assert out.returncode == 0, out.stdout + out.stderr
        return json.loads(out.stdout)

    def popen(self, *args) -> subprocess.Popen:
        return subprocess.Popen(self.argv(*args), cwd=ROOT, env=self.env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def shown(text: str) -> dict:
    """The `name  value` lines a job's or a group's text starts with."""
    head = text.split("\n\n")[0].splitlines()
    return dict(line.split(None, 1) for line in head if not line.startswith(" "))


def read_until(pipe, end: bytes, timeout: float) -> bytes:
    """What a process wrote to `pipe` up to and including `end`, or what came within
    `timeout` seconds (a bounded wait: a hung process fails the test, never hangs it)."""
    got = b""
    deadline = time.monotonic() + timeout
    while end not in got and time.monotonic() < deadline:
        ready, _, _ = select.select([pipe], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        piece = os.read(pipe.fileno(), 4096)
        if not piece:
            break
        got += piece
    return got


@pytest.fixture
def world(out_stack, make_agent):
    """A job agent (a lease of 6 s: it hears of a cancel within 2 s), a running
    `jobqueue-agent` for it, and the CLI configured for its workspace."""
    agent, token = make_agent(lease_seconds=6, max_attempts=1, name="cli")
    key = credentials.issue_workspace_api_key(agent.workspace)
    out_stack.start_agent(agent, token, "cli", concurrency=2,
                          extra_env={"JOBQUEUE_LOG_INTERVAL": "0.2"})
    return agent, Cli(out_stack, agent.workspace_id, key)


def test_create_wait_logs_and_artifacts(world, tmp_path):
    agent, jq = world
    script = ('echo "working on $(cat "$JOB_CONTEXT_FILE" | wc -c) bytes of context"; '
              'printf "the report" > "$JOB_ARTIFACTS_DIR/report.txt"; '
              'head -c 300000 /dev/urandom > "$JOB_ARTIFACTS_DIR/blob.bin"; '
              'echo \'{"answer": 42}\' > "$JOB_RESULT_FILE"; echo done')
    context = json.dumps({"password": "cli-s3cret"})
    created = jq("jobs", "create", "--agent", agent.id, "--context", "-", "--group", "run-1",
                 "--external-id", "ext-1", "--priority", "3", "--wait", "--timeout", "120",
                 "--json", "--", "sh", "-c", script, input=context)
    assert created.returncode == 0, created.stdout + created.stderr + jq.stack.logs()
    job = json.loads(created.stdout)
    assert job["status"] == states.SUCCESSFUL and job["result"] == {"answer": 42}
    assert (job["group"], job["external_id"], job["priority"]) == ("run-1", "ext-1", 3)
    assert job["job_agent_config"] == {"command": ["sh", "-c", script]}
    assert job["dispatch_context_keys"] == ["password"]
    assert "cli-s3cret" not in created.stdout + created.stderr
    row = Job.objects.get(id=job["id"])
    assert row.dispatch_context == {"password": "cli-s3cret"} and row.status == states.SUCCESSFUL

    # Human-readable output.
    got = jq("jobs", "get", job["id"], "--events")
    assert got.returncode == 0, got.stderr
    assert shown(got.stdout)["id"] == job["id"] and shown(got.stdout)["status"] == "successful"
    assert shown(got.stdout)["attempt"] == "1 of 1" and "attempts:" in got.stdout
    assert "events:" in got.stdout and JobEvent.CREATED in got.stdout
    listed = jq("jobs", "list", "--group", "run-1")
    assert listed.returncode == 0 and listed.stdout.splitlines()[0].split()[:2] == ["ID",
                                                                                     "STATUS"]
    assert [line.split()[:2] for line in listed.stdout.splitlines()[1:]] == [
        [job["id"], "successful"]]
    assert [j["id"] for j in jq.json("jobs", "list", "--status", "successful")] == [job["id"]]
    assert jq.json("jobs", "list", "--status", "queued") == []

    # The log, as text and as JSON.
    log = jq("jobs", "logs", job["id"])
    assert log.returncode == 0 and log.stdout == f"working on {len(context)} bytes of context\n" \
                                                 "done\n"
    doc = jq.json("jobs", "logs", job["id"])
    assert (doc["attempt"], doc["text"]) == (1, log.stdout)

    # Artifacts: listed, then downloaded (each checked against its sha256).
    artifacts = jq.json("jobs", "artifacts", job["id"])
    assert sorted(a["name"] for a in artifacts) == ["blob.bin", "report.txt"]
    table = jq("jobs", "artifacts", job["id"])
    assert "report.txt" in table.stdout and "NAME" in table.stdout
    target = tmp_path / "out" / "nested"
    saved = jq.json("jobs", "artifacts", job["id"], "--download", target)
    assert {s["name"] for s in saved} == {"blob.bin", "report.txt"}
    assert (target / "report.txt").read_bytes() == b"the report"
    assert (target / "blob.bin").stat().st_size == 300000
    one = jq("jobs", "artifacts", job["id"], "--download", tmp_path / "one", "--name",
             "report.txt")
    assert one.returncode == 0 and sorted(p.name for p in (tmp_path / "one").iterdir()) == [
        "report.txt"]
    assert "saved " in one.stderr
    missing = jq("jobs", "artifacts", job["id"], "--download", tmp_path / "x", "--name", "nope")
    assert missing.returncode == 3 and "no artifact named nope" in missing.stderr

    group = jq.json("groups", "get", "run-1")
    assert group["counts"]["successful"] == 1 and group["finished"] is True
    assert shown(jq("groups", "get", "run-1").stdout)["finished"] == "yes"


def test_a_job_that_fails_makes_wait_exit_1(world):
    agent, jq = world
    out = jq("jobs", "create", "--agent", agent.id, "--wait", "--", "sh", "-c",
             "echo broken >&2; exit 3")
    assert out.returncode == 1, out.stdout + out.stderr + jq.stack.logs()
    assert shown(out.stdout)["status"] == states.FAILURE
    assert "ended failure" in out.stderr and "waiting for it to end" in out.stderr
    job_id = out.stderr.split("created job ")[1].split()[0]
    assert Job.objects.get(id=job_id).status == states.FAILURE
    again = jq("jobs", "wait", job_id, "--json")  # already ended: answered at once
    assert again.returncode == 1 and json.loads(again.stdout)["status"] == states.FAILURE


def test_logs_follow_a_running_job_to_its_end(world, tmp_path):
    agent, jq = world
    gate = tmp_path / "gate"
    script = f'echo "line 1"; while [ ! -e "{gate}" ]; do sleep 0.1; done; echo "line 2"'
    job_id = jq("jobs", "create", "--agent", agent.id, "-q", "--", "sh", "-c",
                script).stdout.strip()
    uuid.UUID(job_id)  # -q prints the id alone
    follower = jq.popen("jobs", "logs", job_id, "--follow", "--interval", "1")
    try:
        first = read_until(follower.stdout, b"\n", 60)  # printed while the job still runs
        assert first == b"line 1\n", jq.stack.logs()
        assert Job.objects.get(id=job_id).status == states.IN_PROGRESS
        gate.touch()
        rest, err = follower.communicate(timeout=120)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    assert follower.returncode == 0, err
    assert rest == b"line 2\n"
    assert Job.objects.get(id=job_id).status == states.SUCCESSFUL


def test_cancel_requeue_dispatch_and_wait_timeout(world, tmp_path):
    agent, jq = world
    # Each attempt waits for its own gate file.
    script = f'echo "attempt $JOB_ATTEMPT"; while [ ! -e "{tmp_path}/gate-$JOB_ATTEMPT" ]; ' \
             'do sleep 0.1; done'
    job = jq.json("jobs", "create", "--agent", agent.id, "--", "sh", "-c", script)
    wait_for(lambda: Job.objects.get(id=job["id"]).status == states.IN_PROGRESS, 60,
             "the agent to claim the job", on_fail=jq.stack.logs)
    timed_out = jq("jobs", "wait", job["id"], "--timeout", "1", "--json")
    assert timed_out.returncode == 7, timed_out.stderr
    assert json.loads(timed_out.stdout)["status"] == states.IN_PROGRESS
    assert "still in_progress" in json.loads(timed_out.stderr)["error"]["message"]

    cancelled = jq("jobs", "cancel", job["id"], "--reason", "wrong version")
    assert cancelled.returncode == 0 and shown(cancelled.stdout)["status"] == states.CANCELLED
    assert jq("jobs", "cancel", job["id"]).returncode == 0  # answered unchanged
    waited = jq("jobs", "wait", job["id"])
    assert waited.returncode == 1 and shown(waited.stdout)["status"] == states.CANCELLED
    event = JobEvent.objects.filter(job_id=job["id"], kind=JobEvent.CANCELLED).get()
    assert event.detail.get("reason") == "wrong version"

    requeued = jq.json("jobs", "requeue", job["id"])
    assert requeued["status"] in (states.QUEUED, states.IN_PROGRESS)
    wait_for(lambda: Job.objects.get(id=job["id"]).attempt == 2, 60, "the second attempt",
             on_fail=jq.stack.logs)
    (tmp_path / "gate-2").touch()
    # The first attempt's child, if the cancel's kill has not reached it yet, ends too (no
    # shell loop outlives the test).
    (tmp_path / "gate-1").touch()
    done = jq("jobs", "wait", job["id"], "--timeout", "120")
    assert done.returncode == 0, done.stdout + done.stderr + jq.stack.logs()
    assert shown(done.stdout)["attempt"] == "2 of 2"
    # The latest attempt's log by default, an earlier one by number.
    assert jq("jobs", "logs", job["id"]).stdout == "attempt 2\n"
    assert jq("jobs", "logs", job["id"], "--attempt", "1").stdout == "attempt 1\n"

    # A job created held is pending: a requeue is refused (409), a dispatch queues it.
    held = jq.json("jobs", "create", "--agent", agent.id, "--hold", "--config",
                   '{"command": ["true"]}', "--max-attempts", "2")
    assert held["status"] == states.PENDING and held["max_attempts"] == 2
    refused = jq("jobs", "requeue", held["id"])
    assert refused.returncode == 6 and "invalid_transition" in refused.stderr
    assert Job.objects.get(id=held["id"]).status == states.PENDING
    assert jq.json("jobs", "dispatch", held["id"])["status"] in (states.QUEUED,
                                                                 states.IN_PROGRESS)
    assert jq("jobs", "wait", held["id"], "--timeout", "120").returncode == 0
    finished = jq("jobs", "cancel", held["id"])
    assert finished.returncode == 6 and "jobqueue jobs requeue ID" in finished.stderr


def test_groups_get_and_cancel(world):
    agent, jq = world
    ids = [jq.json("jobs", "create", "--agent", agent.id, "--hold", "--group", "run 7",
                   "--", "true")["id"] for _ in range(2)]
    group = jq.json("groups", "get", "run 7")
    assert group["counts"]["pending"] == 2 and group["finished"] is False
    out = jq("groups", "cancel", "run 7", "--reason", "aborted")
    assert out.returncode == 0 and "cancelled 2 jobs" in out.stdout
    assert set(Job.objects.filter(id__in=ids).values_list("status", flat=True)) == {
        states.CANCELLED}
    assert jq.json("groups", "cancel", "run 7") == {"group": "run 7", "cancelled": 0}
    late = jq("jobs", "create", "--agent", agent.id, "--group", "run 7", "--", "true")
    assert late.returncode == 6 and "use a new --group" in late.stderr
    unknown = jq("groups", "get", "never-seen")
    assert unknown.returncode == 3 and "group 'never-seen' not found" in unknown.stderr


def test_errors_name_what_to_change(world):
    agent, jq = world
    missing = jq("jobs", "get", str(uuid.uuid4()))
    assert missing.returncode == 3 and "JOBQUEUE_WORKSPACE" in missing.stderr
    bad_key = jq("jobs", "list", JOBQUEUE_API_KEY="jqk_000000000000_nope")
    assert bad_key.returncode == 4 and "JOBQUEUE_API_KEY" in bad_key.stderr
    unknown_agent = jq("--json", "jobs", "create", "--agent", str(uuid.uuid4()), "--", "true")
    assert unknown_agent.returncode == 2
    error = json.loads(unknown_agent.stderr)
    assert error["exit_code"] == 2 and error["error"]["code"] == "validation_error"
    assert "--agent: No such job agent" in error["error"]["message"]
    assert "job_agent_id" in error["error"]["fields"]
    too_long = jq("jobs", "create", "--agent", agent.id, "--external-id", "x" * 300, "--",
                  "true")
    assert too_long.returncode == 2 and "--external-id:" in too_long.stderr
    down = jq("jobs", "list", "--url", "http://127.0.0.1:9")
    assert down.returncode == 5 and "JOBQUEUE_URL" in down.stderr
    no_url = jq("jobs", "list", JOBQUEUE_URL="")
    assert no_url.returncode == 2 and "set JOBQUEUE_URL (or --url)" in no_url.stderr
    assert Job.objects.filter(workspace_id=agent.workspace_id).count() == 0
