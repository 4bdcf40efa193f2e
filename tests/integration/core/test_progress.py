"""Long commands (prune_jobs, clean_artifacts, reap_claims) show their progress on a terminal:
one line on stderr, rewritten after each batch; nothing with --json or off a terminal. Real
processes, their stderr a pseudo-terminal."""

import io
import json
import os
import pty
import subprocess
import sys

import pytest

from jobqueue import lifecycle
from jobqueue.lifecycle import artifacts
from jobqueue.models import Job, JobArtifact
from tests.factories import JobAgentFactory, claimed_job
from tests.utils import ROOT, subprocess_env

from .test_prune import finished

pytestmark = pytest.mark.django_db(transaction=True)


def run(*argv, terminal=True):
    """(exit status, stdout, what the terminal showed on stderr) of `manage.py argv`."""
    if not terminal:
        proc = subprocess.run([sys.executable, "manage.py", *argv], cwd=ROOT,
                              env=subprocess_env(), capture_output=True, text=True, timeout=120)
        return proc.returncode, proc.stdout, proc.stderr
    master, slave = pty.openpty()
    try:
        proc = subprocess.run([sys.executable, "manage.py", *argv], cwd=ROOT,
                              env=subprocess_env(), stdout=subprocess.PIPE, stderr=slave,
                              timeout=120)
    finally:
        os.close(slave)
    shown = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the terminal's other side is closed and drained
            break
        if not chunk:
            break
        shown += chunk
    os.close(master)
    return proc.returncode, proc.stdout.decode(), shown.decode()


def progress_lines(shown: str) -> list[str]:
    return [part.strip() for part in shown.replace("\r\n", "\n").split("\r") if part.strip()]


def test_prune_jobs_shows_each_batch_on_a_terminal():
    agent = JobAgentFactory()
    for _ in range(5):
        finished("successful", 20, agent=agent)
    status, out, shown = run("prune_jobs", "--batch-size", "2")
    assert status == 0, shown
    assert _progress_ok(shown, [2, 4, 5])
    assert progress_lines(shown)[0].startswith("2 finished jobs deleted in 1 batch(es), ")
    assert shown.endswith("\n") and out.startswith("deleted 5 finished job(s)")
    assert Job.objects.count() == 0


def _progress_ok(shown: str, counts: list[int]) -> bool:
    """The lines in order, whatever the seconds say (a slow machine may take more than 0 s)."""
    lines = progress_lines(shown)
    assert [int(line.split()[0]) for line in lines] == counts, lines
    assert [line.split(" in ")[1].split(" batch")[0] for line in lines] == \
        [str(n) for n in range(1, len(counts) + 1)], lines
    return True


def test_json_and_no_terminal_mean_no_progress():
    agent = JobAgentFactory()
    for _ in range(3):
        finished("failure", 40, agent=agent)
    status, out, shown = run("prune_jobs", "--batch-size", "1", "--json")
    assert status == 0 and shown == "" and json.loads(out)["jobs"] == 3
    for _ in range(3):
        finished("failure", 40, agent=agent)
    status, out, err = run("prune_jobs", "--batch-size", "1", terminal=False)
    assert status == 0 and err == "" and out.startswith("deleted 3 finished job(s)")


def test_reap_claims_shows_each_batch_on_a_terminal():
    from tests.integration.admin.conftest import expire_lease

    agent = JobAgentFactory(max_attempts=3)
    for _ in range(3):
        job, _ = claimed_job(job_agent=agent)
        expire_lease(job)
    status, out, shown = run("reap_claims", "--batch-size", "2")
    assert status == 0, shown
    assert _progress_ok(shown, [2, 3])
    assert "requeued 3" in out


def test_clean_artifacts_shows_each_batch_on_a_terminal():
    agent = JobAgentFactory()
    for n in range(3):
        job, grant = claimed_job(job_agent=agent)
        artifacts.upload_artifact(job.id, grant.claim_id, f"a{n}.bin", io.BytesIO(b"x"))
        lifecycle.release_job(job.id, grant.claim_id)  # never publishable now
    status, out, shown = run("clean_artifacts", "--batch-size", "2")
    assert status == 0, shown
    assert _progress_ok(shown.replace("artifacts deleted", "x"), [2, 3])
    assert out.startswith("deleted 3 artifact(s)") and not JobArtifact.objects.exists()
