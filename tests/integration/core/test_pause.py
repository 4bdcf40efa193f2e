"""Pausing a job agent: its claims hand out nothing while paused, jobs in flight go on, and
no claim hands out a job once a pause has committed (racing claimers on PostgreSQL)."""

import logging
import threading
import time

import pytest
from django.db import transaction

from jobqueue import lifecycle, observe, states
from jobqueue.exceptions import AgentPaused, JobNotClaimable, NotFound
from jobqueue.models import Job, JobAgent, JobClaim
from tests.factories import JobAgentFactory, JobFactory
from tests.utils import run_threads

from .test_races import bulk_jobs


@pytest.mark.django_db
def test_paused_agent_claims_nothing_and_its_jobs_in_flight_go_on(caplog):
    agent = JobAgentFactory()
    held = lifecycle.claim_job(agent, JobFactory(job_agent=agent).id)
    other_held = lifecycle.claim_job(agent, JobFactory(job_agent=agent).id)
    waiting = JobFactory(job_agent=agent)
    seen = []

    def listener(kind, **data):
        seen.append((kind, data.get("job_agent_id")))

    observe.subscribe(listener)
    try:
        with caplog.at_level(logging.INFO, logger="jobqueue.lifecycle"):
            paused, changed = lifecycle.pause_job_agent(agent, "operator:alice", "deploy")
    finally:
        observe.unsubscribe(listener)
    assert changed and paused.paused_at is not None and paused.paused_by == "operator:alice"
    assert paused.paused_reason == "deploy"
    assert seen == [("agent_paused", agent.id)]
    assert f"job agent {agent.id} paused by operator:alice" in caplog.text
    assert "deploy" not in caplog.text  # the caller's text never reaches a log line
    assert lifecycle.is_paused(agent.id)

    # Claims: nothing, by every path; the queued job stays as it was.
    assert lifecycle.claim_next_job(agent) is None
    assert lifecycle.claim_next_jobs(agent, 10) == []
    with pytest.raises(AgentPaused) as refused:
        lifecycle.claim_job(agent, waiting.id)
    assert refused.value.code == "agent_paused"
    waiting.refresh_from_db()
    assert (waiting.status, waiting.attempt) == (states.QUEUED, 0)
    # Another agent's job, or an unknown one, is still a 404, paused or not.
    with pytest.raises(NotFound):
        lifecycle.claim_job(agent, JobFactory().id)

    # In flight: heartbeat, report and release still work.
    assert lifecycle.heartbeat(held.job.id, held.claim_id).claim_expires_at is not None
    done = lifecycle.report_status(held.job.id, held.claim_id, states.SUCCESSFUL)
    assert done.status == states.SUCCESSFUL
    lifecycle.release_job(other_held.job.id, other_held.claim_id)
    assert Job.objects.get(id=other_held.job.id).status == states.QUEUED
    assert lifecycle.claim_next_job(agent) is None  # released, but the agent is paused

    # Pausing again changes nothing (and keeps who paused it).
    again, changed = lifecycle.pause_job_agent(agent, "operator:bob")
    assert not changed and again.paused_by == "operator:alice"

    resumed, changed = lifecycle.resume_job_agent(agent, "operator:bob")
    assert changed and resumed.paused_at is None and resumed.paused_by == ""
    assert resumed.paused_reason == ""
    assert not lifecycle.is_paused(agent.id)
    assert not lifecycle.resume_job_agent(agent, "operator:bob")[1]
    grants = lifecycle.claim_next_jobs(agent, 10)
    assert {g.job.id for g in grants} == {waiting.id, other_held.job.id}


@pytest.mark.django_db
def test_a_named_claim_of_a_running_job_on_a_running_agent_is_still_not_claimable():
    agent = JobAgentFactory()
    job = JobFactory(job_agent=agent)
    lifecycle.claim_job(agent, job.id)
    with pytest.raises(JobNotClaimable):
        lifecycle.claim_job(agent, job.id)


@pytest.mark.django_db
def test_pausing_one_agent_leaves_the_others_claiming():
    agent = JobAgentFactory()
    other = JobAgentFactory(workspace=agent.workspace)
    JobFactory(job_agent=agent)
    theirs = JobFactory(job_agent=other)
    lifecycle.pause_job_agent(agent, "operator:alice")
    assert lifecycle.claim_next_job(agent) is None
    assert lifecycle.claim_next_job(other).job.id == theirs.id


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_no_claim_hands_out_a_job_once_a_pause_has_committed():
    """8 threads drain the agent's queue while a ninth pauses it mid-drain. Every job claimed
    was claimed before the pause returned: the claims in flight when it returned are all
    there are, and each claimer's claims after it saw the pause return are empty."""
    agent = JobAgentFactory()
    total = 4000
    bulk_jobs(agent, total)
    paused = threading.Event()
    at_pause = {}
    claimers = 8

    def worker(i, barrier):
        me = JobAgent.objects.get(id=agent.id)
        barrier.wait()
        if i == claimers:  # the pauser: let the claimers get going first
            while JobClaim.objects.filter(job_agent_id=agent.id).count() < 100:
                time.sleep(0.001)
            # Count inside the pause's transaction, its row lock still held: the claims that
            # committed before it. A claim that committed after the pause would add to them.
            with transaction.atomic():
                lifecycle.pause_job_agent(me, "operator:racer")
                at_pause["claimed"] = JobClaim.objects.filter(job_agent_id=agent.id).count()
            paused.set()
            return None
        got, after = [], []
        while not paused.is_set():
            got.extend(g.job.id for g in lifecycle.claim_next_jobs(me, 2))
            time.sleep(0.002)  # paced, so that the pauser (one thread of nine) gets its turn
        for _ in range(3):  # the pause has returned: every claim from here on is empty
            after.extend(lifecycle.claim_next_jobs(me, 5))
        return got, after

    results = run_threads(worker, claimers + 1)
    claimed = [job_id for r in results[:claimers] for job_id in r[0]]
    after = [g for r in results[:claimers] for g in r[1]]
    assert after == []  # a claim that started after the pause returned got nothing
    assert len(claimed) == len(set(claimed)) == at_pause["claimed"]
    assert 100 <= at_pause["claimed"] < total  # the pause struck mid-drain
    assert JobClaim.objects.count() == at_pause["claimed"]
    assert Job.objects.filter(status=states.QUEUED).count() == total - at_pause["claimed"]
