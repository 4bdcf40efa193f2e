"""The producer's client library and command line on labelled jobs and explain, against a live
server: ProducerClient.create_job(labels=...) and explain_job(), `jobqueue jobs create
--label` and `jobqueue jobs explain` (text and --json)."""

import io
import json
import uuid
from contextlib import redirect_stderr, redirect_stdout

import pytest
from django.db.models.functions import Now
from jobqueue_client import ProducerClient, producer_cli
from jobqueue_client.errors import NotFound

from jobqueue import lifecycle
from jobqueue.models import Job, JobAgent

pytestmark = pytest.mark.usefixtures("wakeups_stopped_after")


@pytest.fixture
def producer(live_world):
    with ProducerClient(live_world.base_url, str(live_world.workspace.id),
                        live_world.key) as client:
        yield client


def _cli(live_world, *argv):
    out, err = io.StringIO(), io.StringIO()
    env = {"JOBQUEUE_URL": live_world.base_url,
           "JOBQUEUE_WORKSPACE": str(live_world.workspace.id),
           "JOBQUEUE_API_KEY": live_world.key}
    with pytest.MonkeyPatch.context() as mp:
        for name, value in env.items():
            mp.setenv(name, value)
        mp.delenv("JOBQUEUE_AGENT", raising=False)
        with redirect_stdout(out), redirect_stderr(err):
            code = producer_cli.main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def test_the_client_creates_a_labelled_job_and_explains_it(live_world, producer):
    job = producer.create_job(labels=["gpu", "linux"], dispatch_context={"token": "s3cret"})
    assert job["labels"] == ["gpu", "linux"] and job["job_agent_id"] is None
    explained = producer.explain_job(job["id"])
    assert explained["claimable"] is True and explained["status"] == "queued"
    assert [r["code"] for r in explained["reasons"]] == ["no_matching_agent"]
    assert explained["agents"] == {"matching": 0, "online": 0}
    agent = lifecycle.create_job_agent(workspace=live_world.workspace, name="gpu-1",
                                       labels=["gpu", "linux", "x86"])
    explained = producer.explain_job(job["id"])
    assert [r["code"] for r in explained["reasons"]] == ["no_matching_agent_online"]
    JobAgent.objects.filter(id=agent.id).update(last_seen_at=Now())
    assert producer.explain_job(job["id"])["reasons"] == []
    [grant] = lifecycle.claim_next_jobs(agent, 10)
    assert str(grant.job.id) == job["id"]
    explained = producer.explain_job(job["id"])
    assert explained["status"] == "in_progress" and explained["claimable"] is False
    assert "s3cret" not in json.dumps(explained)
    with pytest.raises(NotFound):
        producer.explain_job(str(uuid.uuid4()))


def test_the_command_line(live_world):
    code, out, err = _cli(live_world, "jobs", "create", "--label", "gpu", "--label", "linux",
                          "-q")
    assert code == 0, err
    job_id = out.strip()
    assert Job.objects.get(id=job_id).labels == ["gpu", "linux"]
    code, out, err = _cli(live_world, "jobs", "explain", job_id)
    assert code == 0, err
    assert "status     queued" in out and "claimable  yes" in out
    assert "agents     0 matching, 0 online" in out
    assert "  no_matching_agent  No job agent of the workspace" in out
    assert "labels: gpu, linux" in out
    code, out, err = _cli(live_world, "jobs", "explain", job_id, "--json")
    assert code == 0, err
    body = json.loads(out)
    assert body["claimable"] is True and body["reasons"][0]["labels"] == ["gpu", "linux"]
    # A job of one agent, held: one reason; its agent never seen: none online.
    code, out, err = _cli(live_world, "jobs", "create", "--agent", live_world.agent.id,
                          "--hold", "-q")
    assert code == 0, err
    code, out, err = _cli(live_world, "jobs", "explain", out.strip())
    assert code == 0, err
    assert "claimable  no" in out and "  held " in out and "  no_matching_agent_online " in out
    code, out, err = _cli(live_world, "jobs", "explain", uuid.uuid4())
    assert code == 3 and "not found" in err
