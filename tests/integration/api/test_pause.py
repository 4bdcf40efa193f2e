"""Pause and resume a job agent over the API (workspace key): claims answer 204 / empty /
409 `agent_paused` while paused, jobs in flight go on; shown on the agent and in /metrics."""

import pytest
from django.contrib.admin.models import LogEntry
from django.urls import reverse

from jobqueue import lifecycle
from jobqueue.models import Job, JobAgent
from tests.factories import JobFactory
from tests.integration.ops.test_metrics import scrape, value

pytestmark = pytest.mark.django_db


def test_pause_and_resume_over_the_api(world, client):
    producer, agent_caller = world.producer(), world.agent_caller()
    agent_path = f"job-agents/{world.agent.id}"
    first = JobFactory(job_agent=world.agent)
    held = agent_caller.post(f"job-agents/{world.agent.id}/jobs/{first.id}/claim")
    assert held.status_code == 200
    held_job, claim_id = held.json()["job"]["id"], held.json()["claim"]["claim_id"]
    waiting = JobFactory(job_agent=world.agent)

    r = producer.post(f"{agent_path}/pause", json={"reason": "deploying the fleet"})
    assert r.status_code == 200, r.content
    body = r.json()
    assert body["id"] == str(world.agent.id) and body["paused"] is True
    assert body["paused_at"] is not None and body["health"]["jobs_in_flight"] == 1
    assert body["paused_reason"] == "deploying the fleet"
    assert producer.get(agent_path).json()["paused"] is True
    listed = {a["id"]: a["paused"] for a in producer.get("job-agents").json()["results"]}
    assert listed == {str(world.agent.id): True, str(world.other_agent.id): False}
    metrics = scrape(client)
    assert value(metrics, "jobqueue_job_agent_paused", job_agent_id=world.agent.id) == 1
    assert value(metrics, "jobqueue_job_agent_paused", job_agent_id=world.other_agent.id) == 0
    assert value(metrics, "jobqueue_operator_transitions_total", kind="agent_paused") >= 1

    # Claims while paused: 204, an empty batch, 409 agent_paused for a named job.
    assert agent_caller.post(f"job-agents/{world.agent.id}/jobs/claim").status_code == 204
    batch = agent_caller.post(f"job-agents/{world.agent.id}/jobs/claim", json={"limit": 5})
    assert batch.status_code == 200 and batch.json() == {"claims": []}
    named = agent_caller.post(f"job-agents/{world.agent.id}/jobs/{waiting.id}/claim")
    assert named.status_code == 409 and named.json()["code"] == "agent_paused"
    assert Job.objects.get(id=waiting.id).status == "queued"
    # The job in flight goes on.
    hb = agent_caller.post(f"jobs/{held_job}/heartbeat", json={"claim_id": claim_id})
    assert hb.status_code == 200
    done = agent_caller.put(f"jobs/{held_job}/status",
                            json={"claim_id": claim_id, "status": "successful"})
    assert done.status_code == 200 and done.json()["status"] == "successful"
    # Pausing again: the same answer, nothing changes.
    again = producer.post(f"{agent_path}/pause")
    assert again.status_code == 200 and again.json()["paused_at"] == body["paused_at"]

    r = producer.post(f"{agent_path}/resume")
    assert r.status_code == 200 and r.json()["paused"] is False and r.json()["paused_at"] is None
    assert producer.post(f"{agent_path}/resume").json()["paused"] is False
    claimed = agent_caller.post(f"job-agents/{world.agent.id}/jobs/claim")
    assert claimed.status_code == 200 and claimed.json()["job"]["id"] == str(waiting.id)
    metrics = scrape(client)
    assert value(metrics, "jobqueue_job_agent_paused", job_agent_id=world.agent.id) == 0
    assert value(metrics, "jobqueue_operator_transitions_total", kind="agent_resumed") >= 1


def test_pause_refuses_a_bad_body_without_echo_and_changes_nothing(world):
    producer = world.producer()
    bad = "<script>" + "x" * 600
    r = producer.post(f"job-agents/{world.agent.id}/pause", json={"reason": bad})
    assert r.status_code == 400 and r.json()["code"] == "validation_error"
    assert "<script>" not in r.content.decode()
    r = producer.post(f"job-agents/{world.agent.id}/pause", json=["not", "an", "object"])
    assert r.status_code == 400 and "code" in r.json()
    r = producer.post(f"job-agents/{world.agent.id}/pause", raw=b"{")
    assert r.status_code == 400 and r.json()["code"] == "validation_error"
    assert JobAgent.objects.get(id=world.agent.id).paused_at is None


def test_an_agent_token_cannot_pause_its_own_agent(world):
    r = world.agent_caller().post(f"job-agents/{world.agent.id}/pause")
    assert r.status_code == 403 and r.json()["code"] == "permission_denied"
    assert JobAgent.objects.get(id=world.agent.id).paused_at is None


def test_unknown_and_malformed_agents_are_404(world):
    producer = world.producer()
    for agent_id in ["00000000-0000-4000-8000-000000000000", "not-a-uuid"]:
        r = producer.post(f"job-agents/{agent_id}/pause")
        assert r.status_code == 404 and r.json()["code"] == "not_found"


def test_admin_pauses_and_resumes_with_a_log_entry(client, django_user_model, world):
    operator = django_user_model.objects.create_superuser("olga", "olga@example.com", None)
    client.force_login(operator)
    changelist = reverse("admin:jobqueue_jobagent_changelist")
    agents = [str(world.agent.id), str(world.other_agent.id)]
    lifecycle.pause_job_agent(world.other_agent, "operator:someone", "disk full")

    r = client.post(changelist, {"action": "pause_agents", "_selected_action": agents,
                                 "index": 0}, follow=True)
    assert "1 job agent(s) paused (1 already paused)." in r.content.decode()
    assert JobAgent.objects.get(id=world.agent.id).paused_by == "operator:olga"
    entry = LogEntry.objects.get(object_id=str(world.agent.id))
    assert entry.get_change_message() == "Claims paused by operator:olga."
    page = client.get(reverse("admin:jobqueue_jobagent_change", args=[world.agent.id]))
    assert "PAUSED since" in page.content.decode() and "operator:olga" in page.content.decode()
    listing = client.get(changelist).content.decode()
    assert "PAUSED since" in listing and "running" not in listing.split("result_list")[0]
    assert "by operator:someone: disk full" in listing

    r = client.post(changelist, {"action": "resume_agents", "_selected_action": agents,
                                 "index": 0}, follow=True)
    assert "2 job agent(s) resumed." in r.content.decode()
    assert not JobAgent.objects.filter(paused_at__isnull=False).exists()
    page = client.get(reverse("admin:jobqueue_jobagent_change", args=[world.agent.id]))
    assert "PAUSED" not in page.content.decode()


def test_view_only_staff_cannot_pause(client, django_user_model, world):
    from django.contrib.auth.models import Permission

    viewer = django_user_model.objects.create_user("vera", "vera@example.com", None)
    viewer.is_staff = True
    viewer.save()
    viewer.user_permissions.set(Permission.objects.filter(codename="view_jobagent"))
    client.force_login(viewer)
    changelist = reverse("admin:jobqueue_jobagent_changelist")
    assert "pause_agents" not in client.get(changelist).content.decode()
    client.post(changelist, {"action": "pause_agents",
                             "_selected_action": [str(world.agent.id)], "index": 0})
    assert JobAgent.objects.get(id=world.agent.id).paused_at is None
