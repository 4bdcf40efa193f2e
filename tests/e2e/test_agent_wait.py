"""The reference agent long-polls by default (jobqueue-agent --wait-seconds 50) against the
production server: a job created while it waits starts within a bound (no --idle-max sleep),
and SIGTERM during a held claim stops it at once, claiming nothing."""

import signal
import time

import pytest

from jobqueue import states
from jobqueue.models import Job
from tests.utils import database_now, wait_until_claim_held

from .harness import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("wakeups_stopped_after")]


def test_a_waiting_agent_starts_a_new_job_at_once(stack, make_agent, make_jobs, say):
    # The wake-up, not the server's re-check (every 2 s by default) nor a poll, starts it:
    # the bound sits below both (on a slow, shared CI machine a pickup took over 1 s).
    stack.server_env["JOBQUEUE_WAIT_RECHECK_SECONDS"] = "60"
    access = stack.tmp / "access.log"
    since = database_now()
    stack.start_server(workers=1, threads=16, access_log=access)
    agent, token = make_agent(lease_seconds=10)
    a = stack.start_agent(agent, token, "A", idle_max=5)  # polling would sleep up to 5 s
    wait_until_claim_held(agent.id, since)  # idle: its claim is held
    created = time.monotonic()
    [job] = make_jobs(agent, 1, stack.command("true"))
    wait_for(lambda: stack.starts(), 10, "the job to start", interval=0.01, on_fail=stack.logs)
    started = time.monotonic() - created
    say(f"agent pickup (create -> job started) {started * 1000:.0f} ms")
    assert started < 3.0
    # It waited: one claim, held through the idle seconds and answered with the job; a
    # polling agent would have had empty answers (204) by now (0.2 s, 0.4 s, ... apart).
    claims = [line for line in access.read_text().splitlines() if "/jobs/claim" in line]
    assert len(claims) == 1 and '" 200 ' in claims[0], claims
    wait_for(lambda: Job.objects.get(id=job.id).status == states.SUCCESSFUL, 30, "success")
    assert a.stop() == 0


def test_sigterm_during_a_held_claim_stops_the_agent_at_once(stack, make_agent):
    since = database_now()
    stack.start_server(workers=1, threads=16)
    agent, token = make_agent(lease_seconds=10)
    a = stack.start_agent(agent, token, "A")
    wait_until_claim_held(agent.id, since)  # the claim is held (wait_seconds 50)
    stopped = time.monotonic()
    a.signal(signal.SIGTERM)
    assert a.popen.wait(timeout=10) == 0
    assert time.monotonic() - stopped < 3
    assert "event=stopped exit_code=0" in a.output()
