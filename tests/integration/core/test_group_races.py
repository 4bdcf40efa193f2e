"""A group's cancel under racing callers: claims, heartbeats, reports, creates and requeues.
No job of a cancelled group is live, or starts, once the cancel has answered; the cancel
never blocks other agents' claims."""

import threading
import time

import pytest
from django.db import connection, transaction
from django.test import override_settings

from jobqueue import lifecycle, states
from jobqueue.db import db_now
from jobqueue.exceptions import Conflict, GroupCancelled, JobCancelled
from jobqueue.models import Job, JobAgent, JobClaim, JobEvent, JobGroup
from tests.factories import JobAgentFactory
from tests.utils import events_of_kind, run_threads

pytestmark = pytest.mark.django_db(transaction=True)


def grouped_jobs(agent, group: str | None, n: int, **fields) -> list:
    if group is not None:
        JobGroup.objects.get_or_create(workspace_id=agent.workspace_id, name=group)
    jobs = [
        Job(workspace_id=agent.workspace_id, job_agent=agent, group=group,
            max_attempts=agent.max_attempts, initial_max_attempts=agent.max_attempts, **fields)
        for _ in range(n)
    ]
    Job.objects.bulk_create(jobs, batch_size=1000)
    return [j.id for j in jobs]


@pytest.mark.postgres_only
@override_settings(JOBQUEUE={"GROUP_CANCEL_BATCH": 25})
def test_cancel_races_claims_heartbeats_reports_and_creates():
    agent = JobAgentFactory(max_attempts=3)
    group_ids = set(grouped_jobs(agent, "run", 300))
    grouped_jobs(agent, None, 400)  # other work, so that claimers keep claiming after
    cancelled = threading.Event()
    after: dict = {}

    def claimer(i, barrier):
        me = JobAgent.objects.get(id=agent.id)
        barrier.wait()
        late, outcomes = [], []
        while True:
            was_done = cancelled.is_set()
            grant = lifecycle.claim_next_job(me)
            if grant is None:
                return late, outcomes
            if was_done and grant.job.group == "run":
                late.append(grant.job.id)
            try:
                lifecycle.heartbeat(grant.job.id, grant.claim_id)
                status = states.SUCCESSFUL if grant.job.attempt % 2 else states.FAILURE
                lifecycle.report_status(grant.job.id, grant.claim_id, status)
                outcomes.append((grant.job.id, "reported"))
            except Conflict as exc:
                outcomes.append((grant.job.id, exc.code))

    def creator(i, barrier):
        barrier.wait()
        made, refused_after = [], 0
        for _ in range(400):
            was_done = cancelled.is_set()
            try:
                job, _ = lifecycle.create_job(workspace=agent.workspace, job_agent=agent,
                                              group="run")
                made.append((job.id, was_done))
            except GroupCancelled:
                refused_after += 1
                if was_done:
                    break
        return made, refused_after

    def canceller(i, barrier):
        barrier.wait()
        time.sleep(0.05)
        n = lifecycle.cancel_group(agent.workspace_id, "run", actor="operator:t")
        after["db_time"] = db_now()
        cancelled.set()
        return n

    def worker(i, barrier):
        if i == 0:
            return ("cancel", canceller(i, barrier))
        if i <= 2:
            return ("create", creator(i, barrier))
        return ("claim", claimer(i, barrier))

    results = run_threads(worker, 9)
    made = [m for kind, r in results if kind == "create" for m in r[0]]
    assert not [m for m in made if m[1]], "a create into the group landed after the cancel"
    assert all(r[1] >= 1 for kind, r in results if kind == "create")
    late = [j for kind, r in results if kind == "claim" for j in r[0]]
    assert late == [], "a job of the cancelled group was handed out after the cancel"

    all_group = group_ids | {m[0] for m in made}
    rows = dict(Job.objects.filter(group="run").values_list("id", "status"))
    assert set(rows) == all_group
    assert set(rows.values()) <= {states.SUCCESSFUL, states.FAILURE, states.CANCELLED}
    assert not JobClaim.objects.filter(job__group="run").exists()
    assert sum(r for kind, r in results if kind == "cancel") == list(
        rows.values()).count(states.CANCELLED)
    # No claim of the group started after the cancel answered (the database's clock).
    assert not [e for e in events_of_kind(JobEvent.CLAIMED, group="run")
                if e.created_at > after["db_time"]]
    # A holder whose job the cancel took was told job_cancelled; a report that won stands.
    outcomes = [o for kind, r in results if kind == "claim" for o in r[1]]
    for job_id, outcome in outcomes:
        if job_id in all_group:
            if outcome == "reported":
                assert rows[job_id] in (states.SUCCESSFUL, states.FAILURE)
            else:
                assert outcome == JobCancelled.code and rows[job_id] == states.CANCELLED
    # Every cancelled job has exactly one cancelled event.
    n_events = JobEvent.objects.filter(job__group="run", kind=JobEvent.CANCELLED).count()
    assert n_events == list(rows.values()).count(states.CANCELLED)


@override_settings(JOBQUEUE={"GROUP_CANCEL_BATCH": 10})
def test_creates_and_requeues_racing_the_cancel_never_leave_a_live_job():
    agent = JobAgentFactory()
    finished = grouped_jobs(agent, "run", 40, status=states.FAILURE, completed_at=db_now())
    grouped_jobs(agent, "run", 40)
    done = threading.Event()

    def worker(i, barrier):
        barrier.wait()
        if i == 0:
            time.sleep(0.02)
            n = lifecycle.cancel_group(agent.workspace_id, "run")
            done.set()
            return n
        mine = finished[i - 1::3]
        late = 0
        for k in range(60):
            was_done = done.is_set()
            try:
                if k % 2 and mine:
                    lifecycle.requeue_job(mine[k % len(mine)])
                else:
                    lifecycle.create_job(workspace=agent.workspace, job_agent=agent,
                                         group="run")
                late += was_done
            except GroupCancelled:
                pass
        return late

    results = run_threads(worker, 4)
    assert results[1:] == [0, 0, 0], "a create or requeue landed after the cancel answered"
    live = Job.objects.filter(group="run", status__in=states.ACTIVE)
    assert not live.exists()
    assert Job.objects.filter(group="run", status=states.CANCELLED).count() >= 40


@pytest.mark.postgres_only
def test_the_cancel_never_blocks_other_claims_and_waits_only_for_rows_in_flight():
    agent = JobAgentFactory()
    group_ids = grouped_jobs(agent, "run", 20)
    other = grouped_jobs(agent, None, 5)
    locked = threading.Event()
    release = threading.Event()
    timings = {}

    def worker(i, barrier):
        barrier.wait()
        if i == 0:  # a transaction in flight on one job of the group (e.g. a report)
            with transaction.atomic():
                list(Job.objects.select_for_update().filter(id=group_ids[0]))
                locked.set()
                release.wait(10)
            return None
        if i == 1:
            locked.wait(10)
            return lifecycle.cancel_group(agent.workspace_id, "run")
        locked.wait(10)
        time.sleep(0.2)  # the cancel is now waiting on the locked row
        with connection.cursor() as cur:
            cur.execute("SELECT count(*) FROM job WHERE group_name = 'run' AND status = "
                        "'cancelled'")
            timings["cancelled_while_waiting"] = cur.fetchone()[0]
        start = time.monotonic()
        grant = lifecycle.claim_next_job(JobAgent.objects.get(id=agent.id))
        timings["claim"] = time.monotonic() - start
        release.set()
        return grant.job.id

    results = run_threads(worker, 3)
    assert results[1] == 20
    assert results[2] in other
    assert timings["claim"] < 1.0
    assert timings["cancelled_while_waiting"] == 19  # every row but the one in flight
    assert Job.objects.get(id=group_ids[0]).status == states.CANCELLED


@pytest.mark.postgres_only
@pytest.mark.parametrize("write", ["create", "requeue"])
def test_a_create_or_requeue_in_flight_is_cancelled_with_its_group(write):
    """The widest window: the write's transaction is still open when the cancel starts. The
    cancel's mark waits for it, then ends the job it added."""
    agent = JobAgentFactory()
    (finished,) = grouped_jobs(agent, "run", 1, status=states.FAILURE, completed_at=db_now())
    in_flight = threading.Event()
    added = {}

    def worker(i, barrier):
        barrier.wait()
        if i == 0:
            with transaction.atomic():
                if write == "create":
                    job, _ = lifecycle.create_job(workspace=agent.workspace, job_agent=agent,
                                                  group="run")
                else:
                    job = lifecycle.requeue_job(finished)
                added["id"] = job.id
                in_flight.set()
                time.sleep(0.5)  # the cancel starts meanwhile
            return None
        in_flight.wait(10)
        start = time.monotonic()
        n = lifecycle.cancel_group(agent.workspace_id, "run")
        return n, time.monotonic() - start

    results = run_threads(worker, 2)
    n, took = results[1]
    assert n == 1 and took > 0.2  # it waited for the write, then cancelled its job
    assert Job.objects.get(id=added["id"]).status == states.CANCELLED
    assert not Job.objects.filter(group="run", status__in=states.ACTIVE).exists()
