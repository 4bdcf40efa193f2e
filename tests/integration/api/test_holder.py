"""`holder` on claims (kept on the claim and its event, shown in the admin, never in an API
answer) and `expected_attempt` on named claims."""

import pytest
from django.urls import reverse

from jobqueue import lifecycle
from jobqueue.models import Job, JobClaim, JobEvent
from tests.factories import JobFactory
from tests.utils import timeline_events

pytestmark = pytest.mark.django_db

HOLDER = "worker-host-7f3a:4242"


def _never_shown(world, job_id, *answers):
    for r in answers:
        assert HOLDER not in r.content.decode()
    producer = world.producer()
    for path in (f"jobs/{job_id}", "jobs", f"job-agents/{world.agent.id}/jobs?status=in_progress",
                 f"job-agents/{world.agent.id}"):
        r = producer.get(path)
        assert r.status_code == 200 and HOLDER not in r.content.decode(), path


@pytest.mark.parametrize("how", ["next", "batch", "named"])
def test_the_holder_is_kept_for_operators_and_never_answered(world, how):
    job = JobFactory(job_agent=world.agent)
    agent = world.agent_caller()
    base = f"job-agents/{world.agent.id}/jobs"
    if how == "next":
        r = agent.post(f"{base}/claim", json={"holder": HOLDER})
    elif how == "batch":
        r = agent.post(f"{base}/claim", json={"holder": HOLDER, "limit": 5})
    else:
        r = agent.post(f"{base}/{job.id}/claim", json={"holder": HOLDER})
    assert r.status_code == 200
    claim = JobClaim.objects.get(job_id=job.id)
    assert claim.holder == HOLDER
    (event,) = timeline_events(job.id, JobEvent.CLAIMED)  # the job row says it
    assert event.holder == HOLDER and HOLDER not in str(event.detail)
    _never_shown(world, job.id, r)


def test_without_a_holder_nothing_is_recorded(world):
    job = JobFactory(job_agent=world.agent)
    assert world.agent_caller().post(f"job-agents/{world.agent.id}/jobs/claim").status_code == 200
    assert JobClaim.objects.get(job_id=job.id).holder == ""
    assert timeline_events(job.id, JobEvent.CLAIMED)[0].holder == ""


@pytest.mark.parametrize("holder", ["x" * 201, "tab\there", 42, ["a"]])
@pytest.mark.parametrize("named", [False, True])
def test_a_bad_holder_is_a_400_that_claims_nothing(world, holder, named):
    job = JobFactory(job_agent=world.agent)
    path = f"job-agents/{world.agent.id}/jobs/" + (f"{job.id}/claim" if named else "claim")
    r = world.agent_caller().post(path, json={"holder": holder})
    assert r.status_code == 400 and r.json()["code"] == "validation_error"
    assert "holder" in r.json()["fields"]
    assert Job.objects.get(id=job.id).attempt == 0 and not JobClaim.objects.exists()


def test_expected_attempt_claims_only_at_that_attempt(world):
    job = JobFactory(job_agent=world.agent)
    path = f"job-agents/{world.agent.id}/jobs/{job.id}/claim"
    agent = world.agent_caller()
    r = agent.post(path, json={"expected_attempt": 1})
    assert r.status_code == 409 and r.json()["code"] == "job_not_claimable"
    assert Job.objects.get(id=job.id).attempt == 0
    first = agent.post(path, json={"expected_attempt": 0})
    assert first.status_code == 200 and first.json()["claim"]["attempt"] == 1
    lifecycle.release_job(job.id, first.json()["claim"]["claim_id"])
    stale = agent.post(path, json={"expected_attempt": 0})
    assert stale.status_code == 409 and stale.json()["code"] == "job_not_claimable"
    again = agent.post(path, json={"expected_attempt": 1, "holder": HOLDER})
    assert again.status_code == 200 and again.json()["claim"]["attempt"] == 2


@pytest.mark.parametrize("value", [-1, "x", 1.5, True, 2**31, None])
def test_a_bad_expected_attempt_is_a_400(world, value):
    job = JobFactory(job_agent=world.agent)
    r = world.agent_caller().post(f"job-agents/{world.agent.id}/jobs/{job.id}/claim",
                                  json={"expected_attempt": value})
    assert r.status_code == 400 and "expected_attempt" in r.json()["fields"]
    assert not JobClaim.objects.exists()


def test_the_lifecycle_refuses_bad_values_too(world):
    from jobqueue.exceptions import InvalidInput

    job = JobFactory(job_agent=world.agent)
    with pytest.raises(InvalidInput):
        lifecycle.claim_job(world.agent, job.id, holder="\x00")
    with pytest.raises(InvalidInput):
        lifecycle.claim_job(world.agent, job.id, expected_attempt=-1)
    assert not JobClaim.objects.exists()


def test_the_admin_shows_the_holder(admin_client, world):
    job = JobFactory(job_agent=world.agent)
    lifecycle.claim_job(world.agent, job.id, holder=HOLDER)
    page = admin_client.get(reverse("admin:jobqueue_job_change", args=[job.id]))
    assert page.status_code == 200
    html = page.content.decode()
    assert html.count(HOLDER) == 3  # the claim, the claimed event, the attempts table
    attempts = html.split('class="jq-attempts"', 1)[1].split("</table>", 1)[0]
    assert "<th>holder</th>" in attempts and f"<td>{HOLDER}</td>" in attempts
