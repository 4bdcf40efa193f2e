"""Why isn't my job running? `GET jobs/{job_id}/explain` (#28 item 5; docs/api.md "Why isn't
my job running? (explain)"): one test per reason, each turning the job claimable and back,
and a real claim of an agent the job is routed to then taking it: what explain says is what
a claim does (both read jobqueue/claimrule.py). Workspace key only; nothing secret."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

import pytest
from django.db.models.functions import Now

from jobqueue import lifecycle
from jobqueue.db import NowPlusSeconds
from jobqueue.lifecycle import ratelimits
from jobqueue.models import Job, JobAgent, JobGroup
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def _explain(world, job_id) -> dict:
    r = world.producer().get(f"jobs/{job_id}/explain")
    assert r.status_code == 200, r.content
    body = r.json()
    assert set(body) == {"status", "claimable", "reasons", "agents"}
    for reason in body["reasons"]:
        assert reason["detail"] and "dispatch_context" not in reason
    return body


def _codes(body) -> list[str]:
    return [r["code"] for r in body["reasons"]]


def _seen(*agents) -> None:
    """As if each agent had just made a request (presence, by the database's clock)."""
    JobAgent.objects.filter(id__in=[a.id for a in agents]).update(last_seen_at=Now())


def _claims(agent) -> list:
    """What a claim-next of the agent takes now (the ids)."""
    return [grant.job.id for grant in lifecycle.claim_next_jobs(agent, 10)]


def _ready(world, job_id, agents=None) -> None:
    """Explain says the next claim takes it: no reason, claimable."""
    body = _explain(world, job_id)
    assert (body["status"], body["claimable"], body["reasons"]) == ("queued", True, [])
    if agents is not None:
        assert body["agents"] == agents


def _job(world, **fields):
    job, _ = lifecycle.create_job(workspace=world.workspace, job_agent=world.agent, **fields)
    return job


def test_a_ready_job_has_no_reason_and_the_next_claim_takes_it(world):
    _seen(world.agent)
    job = _job(world, dispatch_context={"password": "hunter2"})
    _ready(world, job.id, {"matching": 1, "online": 1})
    assert _claims(world.agent) == [job.id]
    body = _explain(world, job.id)
    assert body["status"] == "in_progress" and body["claimable"] is False
    assert body["reasons"] == [{
        "code": "in_progress", "detail": body["reasons"][0]["detail"],
        "job_agent_id": str(world.agent.id), "attempt": 1}]
    raw = world.producer().get(f"jobs/{job.id}/explain").content.decode()
    assert "hunter2" not in raw and "password" not in raw and "dispatch_context" not in raw


def test_not_before(world):
    _seen(world.agent)
    job = _job(world, delay_seconds=600)
    body = _explain(world, job.id)
    assert body["claimable"] is False and _codes(body) == ["not_before"]
    available_at = Job.objects.get(id=job.id).available_at
    assert body["reasons"][0]["available_at"].replace("Z", "+00:00") == available_at.isoformat()
    assert _claims(world.agent) == []
    Job.objects.filter(id=job.id).update(available_at=Now())
    _ready(world, job.id)
    assert _claims(world.agent) == [job.id]


def test_held_until_dispatched(world):
    _seen(world.agent)
    job = _job(world, hold=True, delay_seconds=600)  # a dispatch queues it available now
    body = _explain(world, job.id)
    assert (body["status"], body["claimable"], _codes(body)) == ("pending", False, ["held"])
    assert _claims(world.agent) == []
    lifecycle.dispatch_job(job.id)
    _ready(world, job.id)
    assert _claims(world.agent) == [job.id]


def test_waiting_on_dependencies(world):
    _seen(world.agent)
    first, second = _job(world), _job(world)
    child = _job(world, depends_on=[first.id, second.id])
    body = _explain(world, child.id)
    assert body["claimable"] is False and _codes(body) == ["waiting_on_dependencies"]
    assert sorted(body["reasons"][0]["waiting_on"]) == sorted([str(first.id), str(second.id)])
    assert set(_claims(world.agent)) == {first.id, second.id}  # the parents, not the child
    for parent in (first, second):
        lifecycle.report_status(parent.id, Job.objects.get(id=parent.id).last_claim_id,
                                "successful")
        if parent is first:
            body = _explain(world, child.id)
            assert body["reasons"][0]["waiting_on"] == [str(second.id)]
    _ready(world, child.id)
    assert _claims(world.agent) == [child.id]


def test_a_dependent_with_a_delay_says_both(world):
    _seen(world.agent)
    parent = _job(world, hold=True)
    child = _job(world, depends_on=[parent.id], delay_seconds=600)
    body = _explain(world, child.id)
    assert _codes(body) == ["waiting_on_dependencies", "not_before"]
    assert body["claimable"] is False


def test_agent_paused(world):
    _seen(world.agent)
    job = _job(world)
    lifecycle.pause_job_agent(world.agent, "operator:test")
    body = _explain(world, job.id)
    assert body["claimable"] is False and _codes(body) == ["agent_paused"]
    assert body["agents"] == {"matching": 1, "online": 1}
    assert _claims(world.agent) == []
    lifecycle.resume_job_agent(world.agent, "operator:test")
    _ready(world, job.id)
    assert _claims(world.agent) == [job.id]


def test_a_labelled_job_is_paused_only_when_every_matching_agent_is(world):
    first = lifecycle.create_job_agent(workspace=world.workspace, name="gpu-1", labels=["gpu"])
    second = lifecycle.create_job_agent(workspace=world.workspace, name="gpu-2",
                                        labels=["gpu", "linux"])
    _seen(first, second, world.agent)  # world.agent has no labels: not counted
    job, _ = lifecycle.create_job(workspace=world.workspace, labels=["gpu"])
    for agent in (first, second):
        lifecycle.pause_job_agent(agent, "operator:test")
    body = _explain(world, job.id)
    assert body["claimable"] is False and _codes(body) == ["agent_paused"]
    assert body["agents"] == {"matching": 2, "online": 2}
    assert _claims(first) == [] and _claims(second) == []
    lifecycle.resume_job_agent(second, "operator:test")
    _ready(world, job.id, {"matching": 2, "online": 2})
    assert _claims(first) == []
    assert _claims(second) == [job.id]


def test_no_matching_agent_then_none_online_then_claimed(world):
    _seen(world.agent)
    job, _ = lifecycle.create_job(workspace=world.workspace, labels=["gpu", "region=eu"])
    body = _explain(world, job.id)
    assert body["claimable"] is True and _codes(body) == ["no_matching_agent"]
    assert body["reasons"][0]["labels"] == ["gpu", "region=eu"]
    assert body["agents"] == {"matching": 0, "online": 0}
    # An agent with only some of the labels does not match.
    lifecycle.create_job_agent(workspace=world.workspace, name="gpu-us", labels=["gpu"])
    assert _codes(_explain(world, job.id)) == ["no_matching_agent"]
    agent = lifecycle.create_job_agent(workspace=world.workspace, name="gpu-eu",
                                       labels=["gpu", "linux", "region=eu"])
    body = _explain(world, job.id)
    assert body["claimable"] is True and _codes(body) == ["no_matching_agent_online"]
    assert body["agents"] == {"matching": 1, "online": 0}  # never seen
    _seen(agent)
    _ready(world, job.id, {"matching": 1, "online": 1})
    assert _claims(agent) == [job.id]


def test_an_agent_seen_too_long_ago_is_not_online(world, settings):
    job = _job(world)
    JobAgent.objects.filter(id=world.agent.id).update(last_seen_at=NowPlusSeconds(-121))
    body = _explain(world, job.id)
    assert body["claimable"] is True and _codes(body) == ["no_matching_agent_online"]
    assert "120 s" in body["reasons"][0]["detail"]
    settings.JOBQUEUE = {**settings.JOBQUEUE, "AGENT_ONLINE_SECONDS": 600}
    _ready(world, job.id, {"matching": 1, "online": 1})
    # The API's own `online` of the agent is the same definition (jobqueue/presence.py).
    assert world.producer().get(f"job-agents/{world.agent.id}").json()["online"] is True


def test_group_cancelled(world):
    _seen(world.agent)
    job = _job(world, group="run-1")
    _ready(world, job.id)
    # A cancel under way: the group is marked, its job not cancelled yet.
    JobGroup.objects.filter(name="run-1").update(cancelled_at=Now())
    body = _explain(world, job.id)
    assert body["claimable"] is False and _codes(body) == ["group_cancelled"]
    assert body["reasons"][0]["group"] == "run-1"
    JobGroup.objects.filter(name="run-1").update(cancelled_at=None)
    _ready(world, job.id)
    assert _claims(world.agent) == [job.id]
    # The cancel ends it: finished, and why.
    assert lifecycle.cancel_group(world.workspace.id, "run-1") == 1
    body = _explain(world, job.id)
    assert (body["status"], body["claimable"]) == ("cancelled", False)
    assert _codes(body) == ["finished", "group_cancelled"]


def test_deadline_passed(world):
    _seen(world.agent)
    job = _job(world)
    Job.objects.filter(id=job.id).update(expires_at=NowPlusSeconds(-1))
    body = _explain(world, job.id)
    assert body["claimable"] is False and _codes(body) == ["deadline_passed"]
    expires_at = Job.objects.get(id=job.id).expires_at
    assert body["reasons"][0]["expires_at"].replace("Z", "+00:00") == expires_at.isoformat()
    assert _claims(world.agent) == []
    Job.objects.filter(id=job.id).update(expires_at=NowPlusSeconds(3600))
    _ready(world, job.id)
    assert _claims(world.agent) == [job.id]


def test_concurrency_limit(world):
    """Held back by its concurrency key (limit 1, one job of the key in progress): explain
    names the key and its slots; when that job ends, the slot goes to this one and the next
    claim takes it. The held state is set as the key's triggers set it (concurrency_held)."""
    _seen(world.agent)
    first = JobFactory(job_agent=world.agent, concurrency_key="tenant-1", concurrency_limit=1)
    assert _claims(world.agent) == [first.id]
    job = JobFactory(job_agent=world.agent, concurrency_key="tenant-1", concurrency_limit=1)
    Job.objects.filter(id=job.id).update(concurrency_held=True)
    body = _explain(world, job.id)
    assert body["claimable"] is False and _codes(body) == ["concurrency_limit"]
    assert {k: body["reasons"][0][k] for k in ("key", "running", "limit")} == {
        "key": "tenant-1", "running": 1, "limit": 1}
    assert _claims(world.agent) == []
    lifecycle.report_status(first.id, Job.objects.get(id=first.id).last_claim_id,
                            "successful")
    Job.objects.filter(id=job.id).update(concurrency_held=None)  # the slot it was given
    _ready(world, job.id)
    assert _claims(world.agent) == [job.id]


def test_rate_limited(world):
    """Held back by its rate limit (1 claim an hour, one job of the key claimed): explain names
    the key, its window and when it opens (the database's clock); when the window has passed,
    a permit goes to this one and the next claim takes it; the job after it is held back
    again, until an hour after that claim."""
    _seen(world.agent)
    ratelimits.set_limit(world.workspace.id, "api", 1, 3600)
    first = JobFactory(job_agent=world.agent, rate_limit_key="api")
    assert _claims(world.agent) == [first.id]
    job = JobFactory(job_agent=world.agent, rate_limit_key="api")
    body = _explain(world, job.id)
    assert body["claimable"] is False and _codes(body) == ["rate_limited"]
    reason = body["reasons"][0]
    started = Job.objects.get(id=first.id).started_at
    assert {k: reason[k] for k in ("key", "count", "period_seconds", "claimed")} == {
        "key": "api", "count": 1, "period_seconds": 3600, "claimed": 1}
    assert _parsed(reason["until"]) == started + timedelta(seconds=3600)
    assert _claims(world.agent) == []
    # The window passes (its claim moved back an hour), and the key is settled (the sweep).
    Job.objects.filter(id=first.id).update(started_at=NowPlusSeconds(-3601))
    ratelimits.settle_key(world.workspace.id, "api")
    _ready(world, job.id)
    assert _claims(world.agent) == [job.id]
    after = JobFactory(job_agent=world.agent, rate_limit_key="api")
    body = _explain(world, after.id)
    assert _codes(body) == ["rate_limited"] and body["reasons"][0]["claimed"] == 1
    assert _parsed(body["reasons"][0]["until"]) == (Job.objects.get(id=job.id).started_at
                                                    + timedelta(seconds=3600))
    assert _claims(world.agent) == []


def test_rate_limited_by_a_key_without_a_limit_answers_nulls(world):
    """Between a limit's removal and the settling of its key: the key limits nothing (the
    reason's limit fields are null, present); settled, the job is given its permit."""
    _seen(world.agent)
    job = JobFactory(job_agent=world.agent, rate_limit_key="gone")
    Job.objects.filter(id=job.id).update(rate_held=True)
    body = _explain(world, job.id)
    assert body["reasons"] == [{"code": "rate_limited", "detail": body["reasons"][0]["detail"],
                                "key": "gone", "count": None, "period_seconds": None,
                                "claimed": None, "until": None}]
    assert _claims(world.agent) == []
    ratelimits.settle_key(world.workspace.id, "gone")
    _ready(world, job.id)
    assert _claims(world.agent) == [job.id]


def _parsed(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def test_a_finished_job_is_not_waiting_until_requeued(world):
    _seen(world.agent)
    job = _job(world)
    [claimed] = _claims(world.agent)
    lifecycle.report_status(claimed, Job.objects.get(id=job.id).last_claim_id, "successful")
    body = _explain(world, job.id)
    assert (body["status"], body["claimable"], _codes(body)) == ("successful", False,
                                                                  ["finished"])
    lifecycle.requeue_job(job.id)
    _ready(world, job.id)
    assert _claims(world.agent) == [job.id]


def test_reasons_add_up(world):
    """Several at once, in their order; none of the agents it may go to online."""
    job = _job(world, delay_seconds=600, group="run-2")
    Job.objects.filter(id=job.id).update(expires_at=NowPlusSeconds(-1))
    JobGroup.objects.filter(name="run-2").update(cancelled_at=Now())
    lifecycle.pause_job_agent(world.agent, "operator:test")
    body = _explain(world, job.id)
    assert body["claimable"] is False
    assert _codes(body) == ["not_before", "deadline_passed", "agent_paused", "group_cancelled",
                            "no_matching_agent_online"]
    assert body["agents"] == {"matching": 1, "online": 0}


@pytest.mark.parametrize("job_id", ["not-a-uuid", str(uuid.uuid4()), "foreign"])
def test_a_job_not_in_the_workspace_is_not_found(world, job_id):
    if job_id == "foreign":
        job, _ = lifecycle.create_job(workspace=world.other_workspace,
                                      job_agent=world.other_workspace_agent)
        job_id = str(job.id)
    r = world.producer().get(f"jobs/{job_id}/explain")
    assert r.status_code == 404 and r.json()["code"] == "not_found"


def test_an_agent_token_is_refused(world):
    job = _job(world)
    r = world.agent_caller().get(f"jobs/{job.id}/explain")
    assert r.status_code == 403 and r.json()["code"] == "permission_denied"
    assert world.anonymous().get(f"jobs/{job.id}/explain").status_code == 401
