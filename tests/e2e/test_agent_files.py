"""The reference agent against what a job's command may leave in its directory, and the
directories a killed agent leaves behind: real `jobqueue-agent` processes, a real server.

- A result file that is not a small regular file (a fifo, a link to /dev/zero) fails the job at
  once with a clear first line; the agent neither blocks nor reads without bound (run under an
  address-space limit, its peak memory measured), and goes on to the next job.
- A SIGKILLed agent's job directory (with the dispatch_context in it) is removed by the next
  agent that starts, once no process of that job is left; a live agent's is never touched.
- A result over the agent's cap (1 MiB) or the server's (JOBQUEUE_MAX_RESULT_BYTES) fails
  its job at once, saying why; the agent goes on.
"""

import os
import signal
import time

import pytest

from jobqueue import states
from jobqueue.models import Job

from .harness import Stack, peak_rss_bytes, pid_alive, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

SECRET = "context-secret-9f1c2e-never-left-behind"
# The agent runs in about 40-60 MiB; without the fix, /dev/zero is read until this limit.
ADDRESS_SPACE = 1024 * 1024**2
PEAK_RSS_BOUND = 150 * 1024**2


def wait_terminal(job, stack, timeout=30):
    def done():
        j = Job.objects.get(id=job.id)
        return j if j.status in states.TERMINAL else None

    return wait_for(done, timeout, f"job {job.id} to end", on_fail=stack.logs)


def first_line(job) -> str:
    return (job.message or "").splitlines()[0]


def test_a_fifo_result_file_fails_the_job_at_once_and_sigterm_still_works(
        stack, make_agent, make_jobs):
    agent, token = make_agent(lease_seconds=2)
    [fifo] = make_jobs(agent, 1, ["sh", "-c", 'mkfifo "$JOB_RESULT_FILE"; exit 0'],
                       timeout_seconds=3)
    a = stack.start_agent(agent, token, "A", drain_timeout=10)
    job = wait_terminal(fifo, stack)
    assert job.status == states.FAILURE
    assert first_line(job) == "JOB_RESULT_FILE is a named pipe (fifo), not a regular file"
    [after] = make_jobs(agent, 1, stack.command())
    assert wait_terminal(after, stack).status == states.SUCCESSFUL
    started = time.monotonic()
    assert a.stop(timeout=30) == 0
    assert time.monotonic() - started < 5
    assert list((stack.tmp / "tmp-A").iterdir()) == []


def test_a_result_file_linked_to_dev_zero_is_refused_within_a_memory_bound(
        stack, make_agent, make_jobs, say):
    agent, token = make_agent(lease_seconds=2)
    [zero] = make_jobs(agent, 1, ["sh", "-c", 'ln -s /dev/zero "$JOB_RESULT_FILE"'])
    a = stack.start_agent(agent, token, "A", address_space_bytes=ADDRESS_SPACE)
    job = wait_terminal(zero, stack)
    assert job.status == states.FAILURE
    assert first_line(job) == "JOB_RESULT_FILE is a symbolic link, not a regular file"
    [after] = make_jobs(agent, 1, stack.command())
    assert wait_terminal(after, stack).status == states.SUCCESSFUL
    peak = peak_rss_bytes(a.pid)
    say(f"agent peak RSS with a /dev/zero result file: {peak / 1024**2:.1f} MiB "
        f"(address space capped at {ADDRESS_SPACE // 1024**2} MiB)")
    assert peak < PEAK_RSS_BOUND
    assert a.stop() == 0
    assert "MemoryError" not in a.output() and "Traceback" not in a.output()


def job_dirs(tmpdir):
    return sorted(p for p in tmpdir.iterdir() if p.name.startswith("jobqueue-job-"))


def holds_secret(path) -> bool:
    return any(SECRET in f.read_text(errors="replace") for f in path.rglob("*") if f.is_file())


def test_a_killed_agents_job_dir_is_removed_by_the_next_agent_but_a_live_ones_stays(
        stack, make_agent, make_jobs):
    agent, token = make_agent(lease_seconds=60)  # nothing is reaped during the test
    shared = stack.tmp / "tmp-shared"
    job_a, job_c = make_jobs(agent, 2, stack.command("sleep 120"),
                             dispatch_context={"password": SECRET})
    a = stack.start_agent(agent, token, "A", tmpdir=shared)
    [start_a] = wait_for(lambda: stack.starts(), 30, "agent A to start a job",
                         on_fail=stack.logs)
    [dir_a] = job_dirs(shared)
    assert dir_a.name.startswith(f"jobqueue-job-{os.getuid()}-{a.pid}-")
    assert holds_secret(dir_a)
    c = stack.start_agent(agent, token, "C", tmpdir=shared, drain_timeout=1)
    wait_for(lambda: len(stack.starts()) == 2, 30, "agent C to start the other job",
             on_fail=stack.logs)
    [dir_c] = [d for d in job_dirs(shared) if d != dir_a]

    a.signal(signal.SIGKILL)
    a.popen.wait()
    # A's child runs on in its own session and holds the directory's lock: it stays.
    assert pid_alive(start_a["pid"])
    b = stack.start_agent(agent, token, "B", tmpdir=shared)
    wait_for(lambda: "event=started" in b.output(), 30, "agent B to start", on_fail=stack.logs)
    assert job_dirs(shared) == sorted([dir_a, dir_c])
    assert b.stop() == 0

    # Once the orphan is gone too, the next agent to start removes A's directory, not C's.
    os.killpg(start_a["pid"], signal.SIGKILL)
    wait_for(lambda: not pid_alive(start_a["pid"]), 30, "A's orphaned child to end")
    b = stack.start_agent(agent, token, "B", tmpdir=shared)
    wait_for(lambda: "event=started" in b.output(), 30, "agent B to start", on_fail=stack.logs)
    assert job_dirs(shared) == [dir_c]
    assert "event=stale_dirs_removed count=1" in b.output()
    assert c.alive() and Job.objects.get(id=job_c.id).status == states.IN_PROGRESS
    assert b.stop() == 0
    assert c.stop() == 0
    assert job_dirs(shared) == []
    assert not any(holds_secret(p) for p in shared.iterdir())
    assert Job.objects.get(id=job_a.id).status == states.IN_PROGRESS  # left to the reaper


@pytest.fixture
def capped_stack(transactional_db, tmp_path):
    """A server with small report caps, so that a result the agent accepts (up to 1 MiB)
    can still be over the server's."""
    with Stack(tmp_path, server_env={"JOBQUEUE_MAX_RESULT_BYTES": "1000",
                                     "JOBQUEUE_MAX_MESSAGE_BYTES": "100000"}) as s:
        yield s


def test_results_over_either_cap_fail_the_job_with_the_reason_not_abandon_it(
        capped_stack, make_agent, make_jobs):
    """#17 items 1 and 6 end to end: a result file over the agent's 1 MiB and a result over
    the server's JOBQUEUE_MAX_RESULT_BYTES both end the job `failure` at once, with a first
    line that says why; nothing is stored of the refused result."""
    stack = capped_stack
    agent, token = make_agent(lease_seconds=5)
    [huge] = make_jobs(agent, 1, ["sh", "-c",
                                  'head -c 2097152 /dev/zero | tr "\\0" x > "$JOB_RESULT_FILE"'])
    [over] = make_jobs(agent, 1, ["sh", "-c", 'printf \'{"k": "%01500d"}\' 0 > "$JOB_RESULT_FILE"'])
    [fits] = make_jobs(agent, 1, ["sh", "-c", 'printf \'{"k": "%0500d"}\' 0 > "$JOB_RESULT_FILE"'])
    a = stack.start_agent(agent, token, "A")
    huge, over, fits = (wait_terminal(j, stack) for j in (huge, over, fits))
    assert huge.status == states.FAILURE and huge.result is None
    assert first_line(huge) == "JOB_RESULT_FILE is larger than 1048576 bytes"
    assert over.status == states.FAILURE and over.result is None
    assert first_line(over) == ("the report was refused (validation_error): Too large: at most "
                                "1000 bytes as compact JSON (JOBQUEUE_MAX_RESULT_BYTES).")
    assert fits.status == states.SUCCESSFUL and fits.result == {"k": "0" * 500}
    assert a.stop() == 0
    assert "Traceback" not in a.output()
