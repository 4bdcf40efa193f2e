"""Acceptance: an agent whose child runs past the job's max_runtime_seconds is stopped (its
heartbeat answers deadline_exceeded: it kills the child and publishes nothing), the reaper
ends the attempt, and another agent process runs the job again to success. Real server,
agents and reaper; both backends."""

import pytest

from jobqueue import lifecycle, states
from jobqueue.models import Job, JobEvent
from tests.utils import timeline_events

from .harness import audit, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_an_overrunning_child_is_stopped_and_the_job_retried_by_another_agent(
        stack, make_agent):
    agent, token = make_agent(lease_seconds=3)
    job, _ = lifecycle.create_job(
        workspace=agent.workspace, job_agent=agent, max_runtime_seconds=2,
        job_agent_config={"command": stack.command(first_attempt="sleep 60")},
    )
    a = stack.start_agent(agent, token, "A")
    wait_for(lambda: stack.starts(job.id), 30, "agent A to start the job", on_fail=stack.logs)
    wait_for(lambda: "code=deadline_exceeded via=heartbeat" in a.output(), 30,
             "agent A to be told the deadline passed", on_fail=stack.logs)
    wait_for(lambda: "event=abandoned" in a.output(), 30, "agent A to stop its child",
             on_fail=stack.logs)
    assert a.stop() == 0
    log_a = a.output()
    assert "child_stopped=True" in log_a and "published=nothing" in log_a
    # Its child was killed: it started and never ended.
    assert [r["what"] for r in stack.executions() if r["job"] == str(job.id)] == ["start"]
    assert Job.objects.get(id=job.id).status == states.IN_PROGRESS  # the reaper has not run

    stack.start_reaper()
    b = stack.start_agent(agent, token, "B")

    def finished():
        j = Job.objects.get(id=job.id)
        return j if j.status in states.TERMINAL else None

    job = wait_for(finished, 60, "the job to end", on_fail=stack.logs)
    assert job.status == states.SUCCESSFUL and job.attempt == 2
    assert job.result["agent"] == "B" and job.result["attempt"] == 2
    events = [e for e in timeline_events(job.id)
              if e.kind not in (JobEvent.CREATED, JobEvent.STALE_WRITE_REFUSED)]
    assert [(e.kind, e.attempt) for e in events] == [
        (JobEvent.CLAIMED, 1), (JobEvent.TIMED_OUT, 1), (JobEvent.CLAIMED, 2),
        (JobEvent.STATUS_REPORTED, 2),
    ]
    assert events[1].detail == {"clock": "max_runtime", "requeued": True}
    refused = JobEvent.objects.filter(job_id=job.id, kind=JobEvent.STALE_WRITE_REFUSED)
    assert {e.detail["code"] for e in refused} == {"deadline_exceeded"}
    report = audit([job.id])
    assert report["violations"] == [] and report["terminal_not_once"] == {}
    assert b.stop() == 0
