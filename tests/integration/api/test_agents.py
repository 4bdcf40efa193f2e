"""Job agents over the API (create, list, detail, health) and the bootstrap commands."""

import io
import json

import pytest
from django.core.management import call_command

from jobqueue import lifecycle
from jobqueue.db import NowPlusSeconds
from jobqueue.models import JobAgent, JobClaim, JobEvent
from tests.factories import JobFactory

from .conftest import Caller

pytestmark = pytest.mark.django_db


def test_create_list_and_detail(world):
    producer = world.producer()
    r = producer.post("job-agents", json={"name": "builder", "lease_seconds": 120,
                                          "max_attempts": 5})
    assert r.status_code == 201, r.content
    agent = r.json()
    assert agent["name"] == "builder" and agent["type"] == "http-pull"
    assert (agent["lease_seconds"], agent["max_attempts"]) == (120, 5)
    assert agent["health"] == {"last_seen_at": None, "jobs_in_flight": 0,
                               "leases_expired_24h": 0}
    defaults = producer.post("job-agents", json={"name": "plain"}).json()
    assert (defaults["lease_seconds"], defaults["max_attempts"]) == (60, 3)
    listed = producer.get("job-agents").json()
    names = [a["name"] for a in listed["results"]]
    assert names == sorted(names) and {"builder", "plain", world.agent.name} <= set(names)
    assert world.other_workspace_agent.name not in names
    assert producer.get(f"job-agents/{agent['id']}").json()["id"] == agent["id"]
    # Claims for the new agent use its lease.
    job = JobFactory(job_agent=JobAgent.objects.get(id=agent["id"]))
    claim = producer.post(f"job-agents/{agent['id']}/jobs/{job.id}/claim").json()["claim"]
    assert claim["lease_seconds"] == 120 and claim["heartbeat_interval_seconds"] == 40


def test_health_counts_claims_and_recently_lost_leases(world):
    producer = world.producer()
    held = [lifecycle.claim_job(world.agent, JobFactory(job_agent=world.agent).id)
            for _ in range(3)]
    lost = held[:2]
    JobClaim.objects.filter(job_id__in=[g.job.id for g in lost]).update(
        claim_expires_at=NowPlusSeconds(-5)
    )
    assert lifecycle.reap_expired_claims_once(100).reaped == 2
    # A lease lost more than 24 hours ago no longer counts.
    old = JobEvent.objects.filter(job_id=lost[0].job.id, kind=JobEvent.REAPED)
    old.update(created_at=NowPlusSeconds(-25 * 3600))
    health = producer.get(f"job-agents/{world.agent.id}").json()["health"]
    assert health["jobs_in_flight"] == 1
    assert health["leases_expired_24h"] == 1
    listed = {a["id"]: a["health"] for a in producer.get("job-agents").json()["results"]}
    assert listed[str(world.agent.id)] == health
    assert listed[str(world.other_agent.id)]["jobs_in_flight"] == 0


def _json_command(*args):
    out = io.StringIO()
    call_command(*args, "--json", stdout=out)
    return json.loads(out.getvalue())


def test_bootstrap_commands_print_working_credentials(db):
    ws = _json_command("create_workspace", "acme")
    assert {"workspace_id", "api_key"} <= set(ws) and ws["api_key"].startswith("jqk_")
    agent = _json_command("create_job_agent", "--workspace", ws["workspace_id"], "runner",
                          "--lease-seconds", "45")
    assert {"job_agent_id", "token"} <= set(agent) and agent["token"].startswith("jqa_")
    producer = Caller(ws["workspace_id"], {"X-API-Key": ws["api_key"]})
    detail = producer.get(f"job-agents/{agent['job_agent_id']}")
    assert detail.status_code == 200 and detail.json()["lease_seconds"] == 45
    job = producer.post("jobs", json={"job_agent_id": agent["job_agent_id"]}).json()
    runner = Caller(ws["workspace_id"], {"Authorization": f"Bearer {agent['token']}"})
    claim = runner.post(f"job-agents/{agent['job_agent_id']}/jobs/claim")
    assert claim.status_code == 200 and claim.json()["job"]["id"] == job["id"]


def test_the_queued_list_pages_in_claim_order_with_fair_and_plain_jobs(world):
    """The queued list's keyset (claim order: priority, COALESCE(fair_at, available_at),
    created_at, id) followed page by page: every claimable job once, in the order a claim
    takes them, ties on the place included."""
    from jobqueue.models import Job

    ws, agent = world.workspace, world.agent
    for i in range(4):
        lifecycle.create_job(workspace=ws, job_agent=agent, fairness_key="a")
        lifecycle.create_job(workspace=ws, job_agent=agent, fairness_key="b")
        lifecycle.create_job(workspace=ws, job_agent=agent, priority=i % 2)
    Job.objects.filter(fairness_key="b").update(fair_at=Job.objects.filter(
        fairness_key="a").order_by("fair_at").values("fair_at")[:1])  # ties
    caller = world.agent_caller()
    seen, url = [], f"job-agents/{agent.id}/jobs?page_size=5"
    while url:
        r = caller.get(url)
        assert r.status_code == 200, r.content
        seen += [j["id"] for j in r.json()["results"]]
        url = r.json()["next"] and r.json()["next"].split(f"/workspaces/{ws.id}/", 1)[1]
    expected = [str(j.id) for j in Job.objects.filter(job_agent=agent).in_claim_order()
                .order_by("-priority", "claim_at", "created_at", "id")]
    assert seen == expected and len(set(seen)) == 12
