"""Why isn't my job running? (jobqueue/explain.py) reads the claim rule (claimrule.verdict),
one definition: every condition of the rule has its reason, a condition added to the rule is
reported by its name until it gets one, and for a labelled job the agent conditions are asked
of the agents that match its labels (claimrule.unmet). The endpoint, reason by reason:
tests/integration/api/test_explain.py."""

import uuid

import pytest
from django.db.models import Q
from django.db.models.functions import Now

from jobqueue import claimrule, explain, lifecycle
from jobqueue.exceptions import NotFound
from jobqueue.models import Job, JobAgent
from tests.factories import JobAgentFactory, JobFactory, WorkspaceFactory

pytestmark = pytest.mark.django_db


def test_every_condition_of_the_rule_has_its_reason():
    names = [c.name for c in claimrule.JOB_CONDITIONS + claimrule.AGENT_CONDITIONS]
    assert sorted(explain.REASONS) == sorted(names)


def test_a_condition_added_to_the_rule_is_reported_by_its_name_until_it_has_a_reason(
        monkeypatch):
    agent = JobAgentFactory()
    JobAgent.objects.filter(id=agent.id).update(last_seen_at=Now())
    job = JobFactory(job_agent=agent)
    assert explain.explain_job(job.id, workspace_id=agent.workspace_id).claimable is True
    monkeypatch.setattr(claimrule, "JOB_CONDITIONS", claimrule.JOB_CONDITIONS + (
        claimrule.Condition("prioritized", lambda: Q(priority__gt=0),
                            "its priority is above 0"),))
    found = explain.explain_job(job.id, workspace_id=agent.workspace_id)
    assert found.claimable is False
    assert found.reasons == [{"code": "prioritized",
                              "detail": "Not met: its priority is above 0."}]
    # What a claim does too: the ORM claim derives from the same conditions.
    assert claimrule.unmet(job.id) == ["prioritized"]


def test_unmet_asks_the_agent_conditions_of_the_agents_matching_a_labelled_job():
    ws = WorkspaceFactory()
    job, _ = lifecycle.create_job(workspace=ws, labels=["gpu"])
    # No agent matches: no agent meets the agent conditions.
    assert claimrule.unmet(job.id) == ["agent_not_paused"]
    found = claimrule.verdict(job.id)
    assert (found.agents, found.job_unmet, found.agent_unmet) == ([], [], ["agent_not_paused"])
    # An agent without the label does not count, paused or not.
    lifecycle.create_job_agent(workspace=ws, name="cpu", labels=["linux"])
    first = lifecycle.create_job_agent(workspace=ws, name="gpu-1", labels=["gpu", "linux"])
    second = lifecycle.create_job_agent(workspace=ws, name="gpu-2", labels=["gpu"])
    assert claimrule.unmet(job.id) == []
    lifecycle.pause_job_agent(first, "operator:test")
    assert claimrule.unmet(job.id) == []  # the second still claims it
    lifecycle.pause_job_agent(second, "operator:test")
    assert claimrule.unmet(job.id) == ["agent_not_paused"]
    assert [a.name for a in claimrule.verdict(job.id).agents] == ["gpu-1", "gpu-2"]
    # Another workspace's agent with the label is not routed to, nor its verdict asked.
    other = WorkspaceFactory()
    lifecycle.create_job_agent(workspace=other, name="gpu-x", labels=["gpu"])
    assert claimrule.unmet(job.id) == ["agent_not_paused"]
    assert claimrule.verdict(job.id, workspace_id=other.id) is None
    lifecycle.resume_job_agent(second, "operator:test")
    assert claimrule.unmet(job.id) == []
    assert [g.job.id for g in lifecycle.claim_next_jobs(second, 10)] == [job.id]


def test_explain_of_a_job_of_another_workspace_is_not_found():
    job = JobFactory()
    with pytest.raises(NotFound):
        explain.explain_job(job.id, workspace_id=WorkspaceFactory().id)
    with pytest.raises(NotFound):
        explain.explain_job(uuid.uuid4(), workspace_id=job.workspace_id)
    assert explain.explain_job(job.id, workspace_id=job.workspace_id).status == "queued"


def test_a_job_held_back_by_its_concurrency_key_names_the_key_and_its_slots():
    """concurrency_slot's reason: the key, the workspace's jobs with it in progress, the job's
    limit. The held state is set here as the key's triggers set it (concurrency_held true:
    the key's slots keep the queued job back), then cleared as when a slot is given to it."""
    agent = JobAgentFactory()
    JobAgent.objects.filter(id=agent.id).update(last_seen_at=Now())
    JobFactory(job_agent=agent, concurrency_key="tenant-1", concurrency_limit=2,
               in_progress=True)
    # Neither another workspace's job with the key nor a job of another key counts.
    JobFactory(concurrency_key="tenant-1", concurrency_limit=2, in_progress=True)
    JobFactory(job_agent=agent, concurrency_key="tenant-2", concurrency_limit=2,
               in_progress=True)
    job = JobFactory(job_agent=agent, concurrency_key="tenant-1", concurrency_limit=2)
    Job.objects.filter(id=job.id).update(concurrency_held=True)

    found = explain.explain_job(job.id, workspace_id=agent.workspace_id)
    assert (found.status, found.claimable) == ("queued", False)
    [reason] = found.reasons
    assert reason == {"code": "concurrency_limit", "detail": reason["detail"],
                      "key": "tenant-1", "running": 1, "limit": 2}
    # One in progress of two: the other slot is held by a queued job given it before.
    assert "at most 2" in reason["detail"] and "given a slot before it" in reason["detail"]
    assert claimrule.unmet(job.id) == ["concurrency_slot"]
    assert explain.CODES.index("concurrency_limit") == explain.CODES.index(
        "deadline_passed") + 1  # in the rule's order

    Job.objects.filter(id=job.id).update(concurrency_held=None)  # a slot is given to it
    found = explain.explain_job(job.id, workspace_id=agent.workspace_id)
    assert (found.claimable, found.reasons) == (True, [])
    assert claimrule.unmet(job.id) == []
