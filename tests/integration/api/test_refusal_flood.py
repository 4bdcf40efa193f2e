"""A flood of refused writes cannot grow the database (#17 item 7).

Refusals are recorded once per job, attempt, operation and code (a `stale_write_refused`
event with a `count`), so 1,000 heartbeats with random claim ids on a finished job add one
event; the admin's timeline is capped and paginated.
"""

import re
import uuid

import pytest
from django.db.models import Sum
from django.urls import reverse

from jobqueue import lifecycle, states
from jobqueue.admin.jobs import TIMELINE_PAGE_SIZE
from jobqueue.exceptions import ClaimSuperseded, JobFinished
from jobqueue.models import Job, JobEvent
from tests.factories import JobAgentFactory, JobFactory, claimed_job
from tests.utils import run_threads

FLOOD = 1000


def _refused(job):
    return JobEvent.objects.filter(job=job, kind=JobEvent.STALE_WRITE_REFUSED)


def test_a_flood_of_stale_heartbeats_on_a_finished_job_adds_one_event(world):
    job, grant = claimed_job(job_agent=world.agent)
    lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL)
    events_before = JobEvent.objects.filter(job=job).count()
    agent = world.agent_caller()
    for _ in range(FLOOD):
        r = agent.post(f"jobs/{job.id}/heartbeat", json={"claim_id": str(uuid.uuid4())})
        assert r.status_code == 409 and r.json()["code"] == "job_finished"
    assert JobEvent.objects.filter(job=job).count() == events_before + 1
    refused = _refused(job).get()
    assert refused.count == FLOOD and refused.last_at >= refused.created_at
    assert refused.detail == {"operation": "heartbeat", "code": "job_finished"}
    # The timeline says so.
    events = world.producer().get(f"jobs/{job.id}").json()["events"]
    assert events[-1]["kind"] == "stale_write_refused" and events[-1]["count"] == FLOOD
    assert events[-1]["last_at"] is not None
    assert all(e["count"] == 1 and e["last_at"] is None for e in events[:-1])


def test_one_event_per_attempt_operation_and_code(world):
    job, first = claimed_job(job_agent=world.agent)
    agent = world.agent_caller()
    stale = str(uuid.uuid4())
    for _ in range(3):
        assert agent.post(f"jobs/{job.id}/heartbeat", json={"claim_id": stale}).status_code == 409
        assert agent.post(f"jobs/{job.id}/release", json={"claim_id": stale}).status_code == 409
    lifecycle.release_job(job.id, first.claim_id)
    second = lifecycle.claim_job(world.agent, job.id)
    for _ in range(2):  # the old claim, on the next attempt
        assert agent.post(f"jobs/{job.id}/heartbeat",
                          json={"claim_id": str(first.claim_id)}).status_code == 409
    lifecycle.cancel_job(job.id)
    assert agent.post(f"jobs/{job.id}/heartbeat",
                      json={"claim_id": str(second.claim_id)}).status_code == 409
    rows = sorted((e.attempt, e.detail["operation"], e.detail["code"], e.count)
                  for e in _refused(job))
    assert rows == [
        (1, "heartbeat", "claim_superseded", 3),
        (1, "release", "claim_superseded", 3),
        (2, "heartbeat", "claim_superseded", 2),
        (2, "heartbeat", "job_cancelled", 1),
    ]
    # Refusals change no job, claim or lease: only this record of them.
    assert Job.objects.get(id=job.id).status == states.CANCELLED


def test_batch_refusals_are_counted_on_the_same_events(world):
    jobs = [claimed_job(job_agent=world.agent) for _ in range(3)]
    for job, grant in jobs:
        lifecycle.report_status(job.id, grant.claim_id, states.FAILURE)
    agent = world.agent_caller()
    for _ in range(4):
        body = {"claims": [{"job_id": str(j.id), "claim_id": str(uuid.uuid4())}
                           for j, _ in jobs]}
        r = agent.post(f"job-agents/{world.agent.id}/heartbeat", json=body)
        assert r.status_code == 200
        assert {x["code"] for x in r.json()["results"]} == {"job_finished"}
        single = agent.post(f"jobs/{jobs[0][0].id}/heartbeat",
                            json={"claim_id": str(uuid.uuid4())})
        assert single.status_code == 409
        body = {"reports": [{"job_id": str(j.id), "claim_id": str(uuid.uuid4()),
                             "status": "successful"} for j, _ in jobs]}
        r = agent.post(f"job-agents/{world.agent.id}/reports", json=body)
        assert {x["code"] for x in r.json()["results"]} == {"job_finished"}
    for i, (job, _) in enumerate(jobs):
        counts = {e.detail["operation"]: e.count for e in _refused(job)}
        assert counts == {"heartbeat": 8 if i == 0 else 4, "status": 4}


@pytest.mark.django_db(transaction=True)
def test_racing_refusals_make_one_event_with_every_one_counted():
    """Threads refused at the same moment on one job, through the single and the batch
    heartbeat and the report: one event per operation, none lost from its count."""
    agent = JobAgentFactory()
    job = JobFactory(job_agent=agent)
    grant = lifecycle.claim_job(agent, job.id)
    lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL)
    n, rounds = 8, 5

    def flood(i, barrier):
        for _ in range(rounds):
            barrier.wait()
            if i % 3 == 0:
                result = lifecycle.heartbeat_many(agent.id, [(job.id, uuid.uuid4())])
                assert result.results[0].code == JobFinished.code
            elif i % 3 == 1:
                with pytest.raises(JobFinished):
                    lifecycle.heartbeat(job.id, uuid.uuid4())
            else:
                with pytest.raises(JobFinished):
                    lifecycle.report_status(job.id, uuid.uuid4(), states.FAILURE)

    run_threads(flood, n)
    refused = _refused(job)
    assert sorted(e.detail["operation"] for e in refused) == ["heartbeat", "status"]
    assert refused.aggregate(total=Sum("count"))["total"] == n * rounds
    heartbeats = refused.get(detail__operation="heartbeat").count
    assert heartbeats == rounds * len([i for i in range(n) if i % 3 != 2])


@pytest.mark.django_db(transaction=True)
def test_racing_first_refusals_on_many_jobs_of_a_batch():
    """Batches that insert their refusals at once, racing one another, fall back to
    counting on the events the winner inserted."""
    agent = JobAgentFactory()
    grants = []
    for _ in range(20):
        job = JobFactory(job_agent=agent)
        grants.append(lifecycle.claim_job(agent, job.id))
        lifecycle.release_job(job.id, grants[-1].claim_id)

    def batch(i, barrier):
        refs = [(g.job.id, g.claim_id) for g in grants]
        if i % 2:
            refs.reverse()
        if i == 0:  # a batch of only some of the jobs: the others stay to be inserted
            refs = refs[::2]
        barrier.wait()
        result = lifecycle.heartbeat_many(agent.id, refs)
        assert {r.code for r in result.results} == {ClaimSuperseded.code}

    run_threads(batch, 6)
    refused = JobEvent.objects.filter(kind=JobEvent.STALE_WRITE_REFUSED)
    assert refused.count() == 20
    counts = {e.job_id: e.count for e in refused}
    assert counts == {g.job.id: 6 if i % 2 == 0 else 5 for i, g in enumerate(grants)}


def test_the_admin_timeline_is_capped_and_paginated(world, admin_client):
    job = JobFactory(job_agent=world.agent)
    JobEvent.objects.bulk_create([
        JobEvent(job=job, kind=JobEvent.PROGRESS_REPORTED, attempt=1, detail={"n": i})
        for i in range(250)
    ])
    total = JobEvent.objects.filter(job=job).count()
    url = reverse("admin:jobqueue_job_change", args=[job.id])

    def rows(response):
        assert response.status_code == 200
        body = response.content.decode()
        table = body.split('class="jq-timeline"', 1)[1].split("</table>", 1)[0]
        return re.findall(r"n=(\d+)", table), body

    newest, body = rows(admin_client.get(url))
    assert newest == [str(i) for i in range(150, 250)]  # the newest page, in time order
    assert f"{TIMELINE_PAGE_SIZE} of {total} events" in body
    older = re.search(r'href="\?timeline_before=(\d+)">older', body).group(1)
    middle, body = rows(admin_client.get(f"{url}?timeline_before={older}"))
    assert middle == [str(i) for i in range(50, 150)]
    assert "newest</a>" in body and ">newer</a>" not in body
    oldest_link = re.search(r'href="\?timeline_before=(\d+)">older', body).group(1)
    oldest, body = rows(admin_client.get(f"{url}?timeline_before={oldest_link}"))
    assert oldest == [str(i) for i in range(50)] and "older</a>" not in body
    assert f"{total - 2 * TIMELINE_PAGE_SIZE} of {total} events" in body
    newer_link = re.search(r'href="\?timeline_before=(\d+)">newer', body).group(1)
    assert rows(admin_client.get(f"{url}?timeline_before={newer_link}"))[0] == middle
    # Anything else in the parameter is the newest page, never an error.
    for junk in ("x", "-1", "0", "9" * 40, "", "\u00b2", "%C2%B2"):
        assert rows(admin_client.get(f"{url}?timeline_before={junk}"))[0] == newest
    # An unknown job is the admin's usual redirect, whatever the parameter.
    missing = reverse("admin:jobqueue_job_change", args=[uuid.uuid4()])
    assert admin_client.get(f"{missing}?timeline_before=5").status_code == 302


def test_the_admin_timeline_shows_a_refusal_count(world, admin_client):
    job, grant = claimed_job(job_agent=world.agent)
    lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL)
    for _ in range(30):
        with pytest.raises(JobFinished):
            lifecycle.heartbeat(job.id, uuid.uuid4())
    body = admin_client.get(reverse("admin:jobqueue_job_change", args=[job.id])).content
    assert "×30, the last at" in body.decode()
    assert body.decode().count("stale write refused") == 1
