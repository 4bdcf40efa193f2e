"""The reference agent's outputs against a real server: the child's stdout and stderr stream
to the attempt's log while it runs (readable live by the producer) and at its end; the files
it leaves in JOB_ARTIFACTS_DIR are uploaded before the successful report, which publishes
them; a job whose attempt is cancelled mid-run publishes nothing."""

import hashlib

import httpx
import pytest

from agents import credentials
from jobqueue import states
from jobqueue.lifecycle import logs
from jobqueue.models import Job, JobArtifact

from .harness import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def wait_status(job, stack, status, timeout=30):
    return wait_for(lambda: Job.objects.get(id=job.id).status == status, timeout,
                    f"job {job.id} to be {status}", on_fail=stack.logs)


def test_the_log_streams_live_and_the_artifacts_are_published(out_stack, make_agent, make_jobs,
                                                              say):
    agent, token = make_agent(lease_seconds=5)
    key = credentials.issue_workspace_api_key(agent.workspace)
    script = ('echo "step 1"; sleep 2; echo "step 2 on stderr" >&2; '
              'printf report > "$JOB_ARTIFACTS_DIR/report.txt"; '
              'head -c 3000000 /dev/urandom > "$JOB_ARTIFACTS_DIR/blob.bin"; sleep 1; echo done')
    [job] = make_jobs(agent, 1, ["sh", "-c", script], dispatch_context={"token": "e2e-s3cret"})
    out_stack.start_agent(agent, token, "A", extra_env={"JOBQUEUE_LOG_INTERVAL": "0.3"})
    api = f"{out_stack.url}/v1/workspaces/{agent.workspace_id}/jobs/{job.id}"
    headers = {"X-API-Key": key}
    # Live: the first line is readable while the job still runs.
    wait_for(lambda: httpx.get(f"{api}/log", headers=headers).content == b"step 1\n", 20,
             "the first line in the log", on_fail=out_stack.logs)
    assert Job.objects.get(id=job.id).status == states.IN_PROGRESS
    wait_status(job, out_stack, states.SUCCESSFUL)
    log = httpx.get(f"{api}/log", headers=headers)
    assert log.content == b"step 1\nstep 2 on stderr\ndone\n"
    assert log.headers["X-Log-Attempt"] == "1"
    assert b"e2e-s3cret" not in log.content
    listed = {a["name"]: a for a in httpx.get(f"{api}/artifacts", headers=headers).json()[
        "results"]}
    assert set(listed) == {"report.txt", "blob.bin"}
    assert listed["blob.bin"]["size"] == 3000000 and listed["blob.bin"]["attempt"] == 1
    got = httpx.get(f"{api}/artifacts/blob.bin", headers=headers)
    assert hashlib.sha256(got.content).hexdigest() == listed["blob.bin"]["sha256"]
    assert httpx.get(f"{api}/artifacts/report.txt", headers=headers).content == b"report"
    say(f"log {len(log.content)} bytes in {len(logs.read_log(job.id).data)} stored; "
        f"artifacts {sorted(listed)}")


def test_a_cancelled_attempt_publishes_nothing_and_keeps_its_last_lines(out_stack, make_agent,
                                                                        make_jobs):
    from jobqueue import lifecycle

    agent, token = make_agent(lease_seconds=2)
    script = ('echo started; printf x > "$JOB_ARTIFACTS_DIR/x.txt"; '
              'trap "echo stopping; exit 0" TERM; while true; do sleep 0.1; done')
    [job] = make_jobs(agent, 1, ["sh", "-c", script])
    out_stack.start_agent(agent, token, "A", extra_env={"JOBQUEUE_LOG_INTERVAL": "0.2"})
    wait_for(lambda: logs.read_log(job.id).data == b"started\n", 20, "the first line",
             on_fail=out_stack.logs)
    lifecycle.cancel_job(job.id)
    # The agent learns it from its next heartbeat, stops the child, and flushes its last line
    # within the grace period.
    # (sh may report its killed `sleep` as "Terminated" in between)
    wait_for(lambda: logs.read_log(job.id).data.endswith(b"stopping\n"), 20,
             "the last line", on_fail=out_stack.logs)
    assert logs.read_log(job.id).data.startswith(b"started\n")
    assert Job.objects.get(id=job.id).status == states.CANCELLED
    assert not JobArtifact.objects.filter(job=job).exists()  # never even uploaded
