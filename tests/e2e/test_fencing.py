"""Fencing at an outside resource, with real processes (#31, DESIGN.md "Effects and verifiable
fencing"): agent 1 claims a job and is paused (SIGSTOP) before it writes; its lease runs out
and is reaped; agent 2 claims the job (attempt 2) and writes to the fenced store
(jobqueue_client.fenced_store, its own process, which fetched the key set once at start);
then the service is stopped, agent 1 resumes, and the store refuses its write (attempt 1 is
stale): the store decided alone, it could not have asked the service."""

import json
import signal
import sys

import httpx
import pytest
from jobqueue_client import verify_fencing_token

from jobqueue import states
from jobqueue.models import Job

from .harness import free_port, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_a_paused_agent_is_refused_by_the_fenced_store_without_asking_the_service(
        stack, make_agent, make_jobs, tmp_path, say):
    agent, token = make_agent(lease_seconds=2, max_attempts=3)
    [job] = make_jobs(agent, 1, stack.command())

    port = free_port()
    store_url = f"http://127.0.0.1:{port}"
    store = stack._spawn("fenced-store", [
        sys.executable, "-m", "jobqueue_client.fenced_store", "--server", stack.url,
        "--workspace", str(agent.workspace_id), "--port", str(port),
    ], stack.env(), ready_line="fenced store listening")
    store.wait_ready()

    def start(name, value):
        go = tmp_path / f"go-{name}"
        env = stack.env(JOBQUEUE_SERVER=stack.url, JOBQUEUE_WORKSPACE=agent.workspace_id,
                        JOBQUEUE_AGENT=agent.id, JOBQUEUE_TOKEN=token, FENCED_STORE=store_url,
                        GO_FILE=go, WRITE_VALUE=value)
        proc = stack._spawn(name, [sys.executable, "tests/e2e/fenced_agent.py"], env)
        return proc, go

    def line(proc, prefix):
        return next((ln for ln in proc.output().splitlines() if ln.startswith(prefix)), None)

    # Agent 1 claims (attempt 1), then is paused before its write.
    one, go_one = start("agent-1", "from agent 1")
    wait_for(lambda: line(one, "claimed"), 60, "agent 1 to claim", on_fail=one.output)
    assert line(one, "claimed").startswith("claimed attempt=1 ")
    one.signal(signal.SIGSTOP)
    go_one.touch()  # it will write as soon as it runs again

    # Its lease runs out and is reaped; the job is queued again.
    def reaped():
        stack.reap_once()
        return Job.objects.get(id=job.id).status == states.QUEUED
    wait_for(reaped, 30, "the reaper to take agent 1's lease back", interval=0.5)

    # Agent 2 claims it (attempt 2), writes to the store, reports the job done.
    two, go_two = start("agent-2", "from agent 2")
    go_two.touch()
    assert two.popen.wait(timeout=60) == 0, two.output()
    assert line(two, "claimed").startswith("claimed attempt=2 ")
    assert line(two, "store status=200"), two.output()
    assert line(two, "report accepted"), two.output()

    # The service goes away: whatever the store decides now, it decides alone.
    stack.kill_server()
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{stack.url}/v1/.well-known/jwks.json", timeout=2)

    one.signal(signal.SIGCONT)
    assert one.popen.wait(timeout=120) == 0, one.output()
    written = line(one, "store status=")
    assert written.startswith("store status=409 "), one.output()
    body = json.loads(written.split("body=", 1)[1])
    assert body["code"] == "stale_attempt"
    assert (body["attempt"], body["highest_attempt"]) == (1, 2)
    assert line(one, "report refused"), one.output()  # the service is down: it cannot say yes

    kept = httpx.get(f"{store_url}/read", params={"key": "result"}, timeout=5).json()
    assert (kept["value"], kept["attempt"]) == ("from agent 2", 2)
    final = Job.objects.get(id=job.id)
    assert (final.status, final.attempt) == (states.SUCCESSFUL, 2)
    say("fenced store: agent 2 (attempt 2) accepted; agent 1 (attempt 1), resumed after its "
        "reap with the service down: " + body["detail"])


def test_the_reference_agent_hands_the_job_its_fencing_token(stack, make_agent, make_jobs,
                                                             tmp_path):
    """jobqueue-agent gives the command the claim's token (JOB_FENCING_TOKEN), which verifies
    with the key set the server publishes."""
    agent, token = make_agent(lease_seconds=5)
    out = tmp_path / "tokens"
    out.mkdir()
    [job] = make_jobs(agent, 1, stack.command(f'printf %s "$JOB_FENCING_TOKEN" > {out}/$JOB_ID'))
    proc = stack.start_agent(agent, token, "A")
    wait_for(lambda: Job.objects.get(id=job.id).status == states.SUCCESSFUL, 60,
             "the job to succeed", on_fail=proc.output)
    jwks = httpx.get(f"{stack.url}/v1/.well-known/jwks.json", timeout=5).json()
    claims = verify_fencing_token((out / str(job.id)).read_text(), jwks,
                                  workspace_id=str(agent.workspace_id), check_expiry=False)
    assert (claims.job_id, claims.attempt) == (str(job.id), 1)
