"""Acceptance scenarios 1-5 (issue 4): crashes of agents, reapers and the API server, with real
processes. Scenarios 1, 3 and 5 run on both backends; 2 and 4 on PostgreSQL."""

import json
import signal

import pytest

from jobqueue import lifecycle, states
from jobqueue.models import Job, JobClaim, JobEvent, ReaperRun
from tests.utils import timeline_events

from .harness import audit, pid_alive, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

SECRET = "sup3r-s3cret-pa55word-do-not-log"


def wait_terminal(job, stack, timeout=60):
    def done():
        j = Job.objects.get(id=job.id)
        return j if j.status in states.TERMINAL else None

    return wait_for(done, timeout, f"job {job.id} to end", on_fail=stack.logs)


def timeline(job):
    """The job's timeline as its readers see it (an agent's final report is read from the
    job row: jobqueue/timeline.py), without its creation."""
    return [(e.kind, e.attempt) for e in timeline_events(job.id) if e.kind != JobEvent.CREATED]


def assert_fenced(job_ids):
    report = audit(job_ids)
    assert report["violations"] == []
    assert report["terminal_not_once"] == {}
    return report


def test_killed_agent_job_is_reaped_and_completed_by_a_second_agent(stack, make_agent, make_jobs):
    """1. SIGKILL after claim: the lease expires, the reaper requeues, another agent finishes:
    attempt 2, one terminal status, the second agent's result."""
    agent, token = make_agent(lease_seconds=2)
    context = {"api_password": SECRET, "rows": [1, 2, 3]}
    [job] = make_jobs(agent, 1, stack.command(first_attempt="sleep 60"),
                      dispatch_context=context)
    stack.start_reaper()
    a = stack.start_agent(agent, token, "A")
    wait_for(lambda: stack.starts(job.id), 30, "agent A to start the job", on_fail=stack.logs)
    a.signal(signal.SIGKILL)
    a.popen.wait()

    b = stack.start_agent(agent, token, "B")
    job = wait_terminal(job, stack)
    assert job.status == states.SUCCESSFUL
    assert job.attempt == 2
    assert job.result == {"attempt": 2, "agent": "B", "context_bytes": len(json.dumps(context))}
    assert timeline(job) == [
        (JobEvent.CLAIMED, 1), (JobEvent.REAPED, 1), (JobEvent.CLAIMED, 2),
        (JobEvent.STATUS_REPORTED, 2),
    ]
    assert_fenced([job.id])
    assert [r["attempt"] for r in stack.starts(job.id)] == [1, 2]

    assert b.stop() == 0
    log_b = b.output()
    assert f"event=claimed job={job.id} attempt=2" in log_b
    assert f"event=reported job={job.id} attempt=2 status=successful" in log_b
    # The secret went to the child (its size is in the result) and nowhere else.
    for proc in stack.procs:
        assert SECRET not in proc.output(), proc.log.name
    assert SECRET not in (job.message or "")
    # B removed its private context file and directory.
    assert list((stack.tmp / "tmp-B").iterdir()) == []


@pytest.mark.postgres_only
def test_stopped_agent_is_refused_after_its_job_was_reclaimed(stack, make_agent, make_jobs):
    """2. SIGSTOP past the lease: another agent completes the job; on SIGCONT the first agent's
    heartbeat is refused, it kills its child and publishes nothing; the winner's result stands."""
    agent, token = make_agent(lease_seconds=2)
    [job] = make_jobs(agent, 1, stack.command(first_attempt="sleep 60"))
    stack.start_reaper()
    a = stack.start_agent(agent, token, "A")
    [start_a] = wait_for(lambda: stack.starts(job.id), 30, "agent A to start the job",
                         on_fail=stack.logs)
    a.signal(signal.SIGSTOP)
    (first_claim,) = [e.claim_id for e in timeline_events(job.id, JobEvent.CLAIMED)
                      if e.attempt == 1]

    b = stack.start_agent(agent, token, "B")
    job = wait_terminal(job, stack)
    assert (job.status, job.attempt, job.result["agent"]) == (states.SUCCESSFUL, 2, "B")
    assert pid_alive(start_a["pid"]), "A's child runs on while A is stopped"

    a.signal(signal.SIGCONT)
    wait_for(lambda: not pid_alive(start_a["pid"]), 30, "A to stop its child", on_fail=stack.logs)
    wait_for(lambda: "event=abandoned" in a.output(), 30, "A to give up the job",
             on_fail=stack.logs)
    log_a = a.output()
    assert f"event=lease_lost job={job.id} attempt=1 code=job_finished" in log_a
    assert f"event=reported job={job.id}" not in log_a

    job.refresh_from_db()
    assert (job.status, job.attempt, job.result["agent"]) == (states.SUCCESSFUL, 2, "B")
    refused = JobEvent.objects.filter(job_id=job.id, kind=JobEvent.STALE_WRITE_REFUSED)
    assert {(e.claim_id, e.detail["operation"], e.detail["code"]) for e in refused} == {
        (first_claim, "heartbeat", "job_finished")
    }
    assert not [e for e in timeline_events(job.id, JobEvent.STATUS_REPORTED)
                if e.claim_id == first_claim]
    ends = [r for r in stack.executions() if r["what"] == "end"]
    assert [(r["attempt"], r["agent"]) for r in ends] == [(2, "B")]
    assert_fenced([job.id])
    assert a.stop() == 0 and b.stop() == 0


def test_heartbeats_keep_a_job_five_times_its_lease_alive(stack, make_agent, make_jobs):
    """3. A job that runs 5x its lease, with the reaper sweeping all along, is never reclaimed."""
    agent, token = make_agent(lease_seconds=3)  # heartbeats every second
    [job] = make_jobs(agent, 1, stack.command("sleep 15"))
    stack.start_reaper(interval=0.2)
    a = stack.start_agent(agent, token, "A")
    job = wait_terminal(job, stack)
    assert (job.status, job.attempt) == (states.SUCCESSFUL, 1)
    assert (job.completed_at - job.started_at).total_seconds() >= 5 * 3
    assert timeline(job) == [(JobEvent.CLAIMED, 1), (JobEvent.STATUS_REPORTED, 1)]
    assert len(stack.starts(job.id)) == 1
    assert_fenced([job.id])
    assert a.stop() == 0


@pytest.mark.postgres_only
def test_two_racing_reapers_make_exactly_one_new_attempt(stack, make_agent, make_jobs, settings,
                                                         say):
    """4. Two reapers sweeping in a tight loop when many leases expire: each job is reaped
    once, and completed at attempt 2."""
    settings.JOBQUEUE = {**settings.JOBQUEUE, "MIN_LEASE_SECONDS": 1}
    agent, token = make_agent(lease_seconds=2, max_attempts=3)
    jobs = make_jobs(agent, 60, stack.command())
    ids = [j.id for j in jobs]
    # An agent that claims everything and vanishes.
    assert len(lifecycle.claim_next_jobs(agent, 60)) == 60
    # Small batches, so that the two interleave on the same expired claims.
    reapers = [stack.start_reaper(interval=0.02, batch_size=3) for _ in range(2)]
    wait_for(lambda: Job.objects.filter(id__in=ids, status=states.QUEUED).count() == 60,
             60, "both reapers to requeue every job", on_fail=stack.logs)
    assert [r.stop() for r in reapers] == [0, 0]

    reaped = JobEvent.objects.filter(job_id__in=ids, kind=JobEvent.REAPED)
    assert reaped.count() == 60
    assert len({e.job_id for e in reaped}) == 60
    assert not JobClaim.objects.filter(job_id__in=ids).exists()
    by_pid = {}
    for run in ReaperRun.objects.filter(requeued__gt=0):
        by_pid[run.pid] = by_pid.get(run.pid, 0) + run.requeued
    say(f"racing reapers: requeued per reaper process {by_pid}")
    assert sum(by_pid.values()) == 60

    b = stack.start_agent(agent, token, "B", concurrency=4)
    wait_for(lambda: Job.objects.filter(id__in=ids, status=states.SUCCESSFUL).count() == 60,
             60, "agent B to complete every job", on_fail=stack.logs)
    assert set(Job.objects.filter(id__in=ids).values_list("attempt", flat=True)) == {2}
    for job in jobs:
        assert timeline(job) == [
            (JobEvent.CLAIMED, 1), (JobEvent.REAPED, 1), (JobEvent.CLAIMED, 2),
            (JobEvent.STATUS_REPORTED, 2),
        ]
    assert_fenced(ids)
    assert b.stop() == 0


def test_agent_rides_out_an_api_server_crash(stack, make_agent, make_jobs):
    """5. The API server is SIGKILLed mid-job and restarted: the agent's heartbeats and its
    report are retried within the lease and the job completes once; the lease survives."""
    agent, token = make_agent(lease_seconds=10)
    [job] = make_jobs(agent, 1, stack.command("sleep 2"))
    stack.start_reaper()
    a = stack.start_agent(agent, token, "A")
    wait_for(lambda: stack.starts(job.id), 30, "agent A to start the job", on_fail=stack.logs)
    claim = JobClaim.objects.get(job_id=job.id)

    stack.kill_server()
    # The lease lives in the database, not in the server process.
    assert JobClaim.objects.filter(job_id=job.id, claim_id=claim.claim_id).exists()
    wait_for(lambda: f"event=report_retry job={job.id} attempt=1 code=network_error"
             in a.output(), 30, "the agent to retry its report while the server is down",
             on_fail=stack.logs)
    assert Job.objects.get(id=job.id).status == states.IN_PROGRESS
    assert JobClaim.objects.get(job_id=job.id).claim_id == claim.claim_id

    stack.start_server()
    job = wait_terminal(job, stack)
    assert (job.status, job.attempt, job.result["agent"]) == (states.SUCCESSFUL, 1, "A")
    assert timeline(job) == [(JobEvent.CLAIMED, 1), (JobEvent.STATUS_REPORTED, 1)]
    assert len(stack.starts(job.id)) == 1
    assert_fenced([job.id])
    assert a.stop() == 0
