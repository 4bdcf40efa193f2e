"""Why isn't my job running? (jobqueue/explain.py) reads the claim rule (claimrule.verdict),
one definition: every condition of the rule has its reason, a condition added to the rule is
reported by its name until it gets one, and for a labelled job the agent conditions are asked
of the agents that match its labels (claimrule.unmet). The endpoint, reason by reason:
tests/integration/api/test_explain.py."""

import uuid
from datetime import timedelta

import pytest
from django.db.models import Q
from django.db.models.functions import Now

from jobqueue import claimrule, explain, lifecycle
from jobqueue.db import NowPlusSeconds, db_now
from jobqueue.exceptions import NotFound
from jobqueue.lifecycle import ratelimits
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


def _online_agent():
    agent = JobAgentFactory()
    JobAgent.objects.filter(id=agent.id).update(last_seen_at=Now())
    return agent


def _window_passed(*jobs) -> None:
    """As if the jobs' claims had left a window of an hour (their started_at moved back on
    the database's clock)."""
    Job.objects.filter(id__in=[j.id for j in jobs]).update(started_at=NowPlusSeconds(-3601))


def test_a_job_held_back_by_its_rate_limit_names_the_key_its_window_and_when_it_opens():
    """rate_permit's reason: the key's limit, its jobs claimed in the window (a job of another
    workspace or another key, or claimed before the window, does not count) and `until`, on
    the database's clock: the oldest claim in the window plus the period."""
    agent = _online_agent()
    ws = agent.workspace_id
    ratelimits.set_limit(ws, "api", 2, 3600)
    old = JobFactory(job_agent=agent, rate_limit_key="api")
    assert [g.job.id for g in lifecycle.claim_next(agent, limit=5)] == [old.id]
    _window_passed(old)  # claimed before the window: not counted
    other = JobAgentFactory()
    ratelimits.set_limit(other.workspace_id, "api", 5, 3600)
    JobFactory(job_agent=other, rate_limit_key="api", in_progress=True)
    JobFactory(job_agent=agent, rate_limit_key="web", in_progress=True)
    ratelimits.settle_key(ws, "api")
    first, second = (JobFactory(job_agent=agent, rate_limit_key="api") for _ in range(2))
    assert len(lifecycle.claim_next(agent, limit=5)) == 2
    job = JobFactory(job_agent=agent, rate_limit_key="api")
    assert Job.objects.get(id=job.id).rate_held is True

    found = explain.explain_job(job.id, workspace_id=ws)
    assert (found.status, found.claimable) == ("queued", False)
    [reason] = found.reasons
    oldest = Job.objects.get(id=first.id).started_at
    assert reason == {"code": "rate_limited", "detail": reason["detail"], "key": "api",
                      "count": 2, "period_seconds": 3600, "claimed": 2,
                      "until": oldest + timedelta(seconds=3600)}
    assert "at most 2 " in reason["detail"] and "2 of them were claimed" in reason["detail"]
    assert reason["until"].isoformat() in reason["detail"]
    assert claimrule.unmet(job.id) == ["rate_permit"]
    assert explain.CODES.index("rate_limited") == explain.CODES.index(
        "concurrency_limit") + 1  # in the rule's order

    _window_passed(first, second)
    ratelimits.settle_key(ws, "api")  # the window opened: a permit is given to it
    found = explain.explain_job(job.id, workspace_id=ws)
    assert (found.claimable, found.reasons) == (True, [])
    assert claimrule.unmet(job.id) == []


def test_a_job_held_back_by_permits_of_queued_jobs_opens_a_period_from_now():
    """No job of the key in the window: the permits are held by queued jobs given one before
    it; none of their claims can leave the window before a period from now."""
    agent = _online_agent()
    ws = agent.workspace_id
    ratelimits.set_limit(ws, "api", 1, 600)
    JobFactory(job_agent=agent, rate_limit_key="api")  # given the permit
    job = JobFactory(job_agent=agent, rate_limit_key="api")
    before = db_now()
    [reason] = explain.explain_job(job.id, workspace_id=ws).reasons
    after = db_now()
    assert (reason["code"], reason["count"], reason["period_seconds"], reason["claimed"]) == (
        "rate_limited", 1, 600, 0)
    assert (before + timedelta(seconds=600) <= reason["until"]
            <= after + timedelta(seconds=600))
    assert "given a permit before it" in reason["detail"]


def test_a_held_job_whose_key_has_no_limit_says_so():
    """Between a limit's removal and the settling of its key (the triggers' announcement, the
    sweep): the key limits nothing, and nothing is counted."""
    agent = _online_agent()
    job = JobFactory(job_agent=agent, rate_limit_key="gone")
    Job.objects.filter(id=job.id).update(rate_held=True)
    [reason] = explain.explain_job(job.id, workspace_id=agent.workspace_id).reasons
    assert reason == {"code": "rate_limited", "detail": reason["detail"], "key": "gone",
                      "count": None, "period_seconds": None, "claimed": None, "until": None}
    assert "no limit" in reason["detail"]
    ratelimits.settle_key(agent.workspace_id, "gone")
    assert explain.explain_job(job.id, workspace_id=agent.workspace_id).reasons == []


def test_a_job_with_both_keys_names_both():
    """Held back by both keys (a permit goes only to a job holding its concurrency slot): both
    reasons, in the rule's order. The held state is set as the triggers set it."""
    agent = _online_agent()
    ws = agent.workspace_id
    ratelimits.set_limit(ws, "api", 5, 3600)
    JobFactory(job_agent=agent, concurrency_key="c", concurrency_limit=1, in_progress=True)
    job = JobFactory(job_agent=agent, concurrency_key="c", concurrency_limit=1,
                     rate_limit_key="api")
    Job.objects.filter(id=job.id).update(concurrency_held=True, rate_held=True)
    assert claimrule.unmet(job.id) == ["concurrency_slot", "rate_permit"]
    reasons = explain.explain_job(job.id, workspace_id=ws).reasons
    assert [r["code"] for r in reasons] == ["concurrency_limit", "rate_limited"]
    assert reasons[1]["claimed"] == 0 and "concurrency slot" in reasons[1]["detail"]
