"""The POSIX shell agent in docs/examples/shell-agent.sh (curl and jq) against a real server,
with the reaper running: it claims, heartbeats in the background (a job longer than its
lease survives), runs, and reports success, failure and the job's result."""

import subprocess
from pathlib import Path

import pytest

from jobqueue import states
from jobqueue.models import Job, JobEvent

from .harness import ROOT, audit

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

SHELL_AGENT = ROOT / "docs" / "examples" / "shell-agent.sh"


def test_the_shell_agent_runs_jobs_end_to_end(stack, make_agent, make_jobs, tmp_path: Path):
    agent, token = make_agent(lease_seconds=2, max_attempts=1, name="shell")
    quick = make_jobs(agent, 3, stack.command("true"))
    failing = make_jobs(agent, 1, stack.command("exit 3"))
    # Twice its lease: it ends successful only if the background heartbeats kept the lease.
    longer = make_jobs(agent, 1, stack.command("sleep 4"), priority=-1)
    ids = [j.id for j in quick + failing + longer]
    stack.start_reaper(interval=0.3)
    env = stack.env(JOBQUEUE_SERVER=stack.url, JOBQUEUE_WORKSPACE=agent.workspace_id,
                    JOBQUEUE_AGENT=agent.id, JOBQUEUE_TOKEN=token, JOBQUEUE_EXIT_WHEN_IDLE=1,
                    E2E_AGENT="sh")
    log = tmp_path / "shell-agent.log"
    with open(log, "wb") as out:  # a file, not a pipe: a job's orphan cannot hold it open
        try:
            code = subprocess.run(["sh", str(SHELL_AGENT)], env=env, cwd=tmp_path, timeout=180,
                                  stdout=out, stderr=subprocess.STDOUT).returncode
        except subprocess.TimeoutExpired:
            pytest.fail("the shell agent did not finish:\n" + log.read_text() + stack.logs())
    said = log.read_text()
    assert code == 0, said
    report = audit(ids)
    assert report["violations"] == [] and report["terminal_not_once"] == {}
    assert report["statuses"] == {states.SUCCESSFUL: 4, states.FAILURE: 1}
    long_job = Job.objects.get(id=longer[0].id)
    assert long_job.status == states.SUCCESSFUL and long_job.attempt == 1
    assert not JobEvent.objects.filter(job_id=long_job.id, kind=JobEvent.REAPED).exists()
    # The job's result file is the reported result; the exit status is the message.
    assert long_job.result["attempt"] == 1 and long_job.result["agent"] == "sh"
    assert long_job.result["context_bytes"] > 0
    failed = Job.objects.get(id=failing[0].id)
    assert failed.message == "exit status 3"
    assert "stopped" in said and token not in said


def claim_answers(access_log: Path, status: str) -> int:
    """How many claim-next requests the server answered with `status` (gunicorn's access
    log: one line per answered request)."""
    return sum(1 for line in access_log.read_text().splitlines()
               if "/jobs/claim HTTP" in line and f'" {status} ' in line)


def test_the_shell_agent_long_polls_instead_of_polling(stack, make_agent, make_jobs,
                                                       tmp_path: Path):
    """Idle, it holds one claim open (wait_seconds) instead of asking every second: over a
    few idle seconds the server answers none of its claims empty; a job created meanwhile is
    handed to the held claim; SIGTERM ends the next held claim and the agent exits 0."""
    import signal
    import time

    from .harness import wait_for

    access_log = tmp_path / "access.log"
    stack.start_server(access_log=access_log)
    agent, token = make_agent(lease_seconds=30, name="shell-wait")
    env = stack.env(JOBQUEUE_SERVER=stack.url, JOBQUEUE_WORKSPACE=agent.workspace_id,
                    JOBQUEUE_AGENT=agent.id, JOBQUEUE_TOKEN=token, JOBQUEUE_WAIT_SECONDS=20,
                    JOBQUEUE_IDLE_SECONDS=1, E2E_AGENT="sh")
    log = tmp_path / "shell-agent.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(["sh", str(SHELL_AGENT)], env=env, cwd=tmp_path, stdout=out,
                                stderr=subprocess.STDOUT)
        try:
            time.sleep(4)  # idle: a polling agent would have been answered 204 three times
            assert claim_answers(access_log, "204") == 0, access_log.read_text()
            [job] = make_jobs(agent, 1, stack.command("true"))
            wait_for(lambda: Job.objects.get(id=job.id).status == states.SUCCESSFUL, 60,
                     "the held claim to get the job", on_fail=stack.logs)
            assert claim_answers(access_log, "200") == 1
            assert claim_answers(access_log, "204") == 0, access_log.read_text()
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    said = log.read_text()
    assert code == 0, said
    assert "stopped" in said and token not in said
    # The claim held when SIGTERM came was hung up by the agent: the server may answer it 204
    # (to nobody) once it notices, before or after this line reads the log. No other.
    assert claim_answers(access_log, "204") <= 1, access_log.read_text()
