"""An agent's final report is read from the job row, not stored (jobqueue/timeline.py): what
the producer's timeline, the attempts and the log's grace period show for it, over the API."""

import datetime as dt
import re

import pytest
from django.urls import reverse

from jobqueue import lifecycle
from jobqueue.admin.jobs import TIMELINE_PAGE_SIZE
from jobqueue.db import NowPlusSeconds
from jobqueue.models import Job, JobEvent
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def claimed(world):
    job = JobFactory(job_agent=world.agent)
    grant = lifecycle.claim_job(world.agent, job.id)
    return job, str(grant.claim_id)


def _detail(world, job_id):
    r = world.producer().get(f"jobs/{job_id}")
    assert r.status_code == 200
    return r.json()


def test_the_agents_report_is_on_the_timeline_without_an_event_row(world, claimed):
    job, claim = claimed
    agent = world.agent_caller()
    r = agent.put(f"jobs/{job.id}/status", json={"claim_id": claim, "status": "successful",
                                                  "message": "done", "result": {"n": 1}})
    assert r.status_code == 200
    assert not JobEvent.objects.filter(job=job, kind=JobEvent.STATUS_REPORTED).exists()
    body = _detail(world, job.id)
    last = body["events"][-1]
    stored = Job.objects.get(id=job.id)
    assert last["kind"] == "status_reported" and last["attempt"] == 1
    assert last["actor"] == f"agent:{world.agent.id}"
    assert last["detail"] == {"status": "successful", "has_result": True, "message": "done"}
    assert last["count"] == 1 and last["last_at"] is None
    assert last["created_at"] == body["completed_at"]
    assert stored.completed_at is not None
    assert [e["kind"] for e in body["events"]] == ["claimed", "status_reported"]
    assert [(a["number"], a["outcome"], a["message"], a["ended_at"])
            for a in body["attempts"]] == [(1, "successful", "done", body["completed_at"])]


def test_a_report_that_leaves_an_earlier_message_is_stored(world, claimed):
    job, claim = claimed
    agent = world.agent_caller()
    assert agent.put(f"jobs/{job.id}/status", json={
        "claim_id": claim, "status": "in_progress", "message": "halfway"}).status_code == 200
    assert agent.put(f"jobs/{job.id}/status", json={
        "claim_id": claim, "status": "successful"}).status_code == 200
    # The job keeps "halfway"; the report did not say it, so its event is a row.
    (row,) = JobEvent.objects.filter(job=job, kind=JobEvent.STATUS_REPORTED)
    assert row.detail == {"status": "successful", "has_result": False}
    events = _detail(world, job.id)["events"]
    assert [e["kind"] for e in events].count("status_reported") == 1
    assert events[-1]["detail"] == {"status": "successful", "has_result": False}


def test_the_holder_may_append_to_its_log_in_the_grace_period_after_its_report(world,
                                                                               claimed):
    job, claim = claimed
    agent = world.agent_caller()
    assert agent.put(f"jobs/{job.id}/status",
                     json={"claim_id": claim, "status": "successful"}).status_code == 200
    log = {"X-Claim-Id": claim}
    r = agent.request("PATCH", f"jobs/{job.id}/log", raw=b"last lines\n",
                      content_type="text/plain", headers=log)
    assert r.status_code == 202 and r.json() == {"attempt": 1, "length": 11}
    Job.objects.filter(id=job.id).update(completed_at=NowPlusSeconds(-31))
    r = agent.request("PATCH", f"jobs/{job.id}/log", raw=b"too late\n",
                      content_type="text/plain", headers=log)
    assert r.status_code == 409 and r.json()["code"] == "job_finished"


def test_a_requeue_of_the_finished_job_keeps_its_report(world, claimed):
    job, claim = claimed
    agent = world.agent_caller()
    assert agent.put(f"jobs/{job.id}/status", json={
        "claim_id": claim, "status": "failure", "message": "boom"}).status_code == 200
    assert not JobEvent.objects.filter(job=job, kind=JobEvent.STATUS_REPORTED).exists()
    r = world.producer().post(f"jobs/{job.id}/requeue", json={})
    assert r.status_code == 200 and r.json()["status"] == "queued"
    (row,) = JobEvent.objects.filter(job=job, kind=JobEvent.STATUS_REPORTED)
    assert (row.detail, row.attempt, str(row.claim_id)) == (
        {"status": "failure", "has_result": False, "message": "boom"}, 1, claim)
    second = lifecycle.claim_job(world.agent, job.id)
    assert agent.put(f"jobs/{job.id}/status", json={
        "claim_id": str(second.claim_id), "status": "successful",
        "message": "ok"}).status_code == 200
    body = _detail(world, job.id)
    assert [e["kind"] for e in body["events"]] == [
        "claimed", "status_reported", "requeued", "claimed", "status_reported"]
    assert [(a["number"], a["outcome"]) for a in body["attempts"]] == [
        (1, "failure"), (2, "successful")]


def test_the_admin_timeline_shows_the_report_on_the_page_its_time_falls_in(world,
                                                                             admin_client,
                                                                             claimed):
    job, claim = claimed
    lifecycle.report_status(job.id, claim, "successful", message="fine",
                            job_agent_id=world.agent.id)
    done = Job.objects.get(id=job.id).completed_at
    second = dt.timedelta(seconds=1)
    JobEvent.objects.bulk_create(
        [JobEvent(job=job, kind=JobEvent.PROGRESS_REPORTED, attempt=1, detail={"n": i},
                  created_at=done - (150 - i) * second) for i in range(150)]
        + [JobEvent(job=job, kind=JobEvent.PROGRESS_REPORTED, attempt=1, detail={"n": i},
                    created_at=done + (i - 149) * second) for i in range(150, 270)])
    url = reverse("admin:jobqueue_job_change", args=[job.id])

    def page(query=""):
        body = admin_client.get(url + query).content.decode()
        table = body.split('class="jq-timeline"', 1)[1].split("</table>", 1)[0]
        return table, body

    newest, body = page()
    assert "message=fine" not in newest and f"{TIMELINE_PAGE_SIZE} of 272 events" in body
    older = re.search(r'href="\?timeline_before=(\d+)">older', body).group(1)
    middle, body = page(f"?timeline_before={older}")
    # The claim and the report, both read from the row, on the page their times fall in.
    assert "message=fine" in middle and f"{TIMELINE_PAGE_SIZE + 2} of 272 events" in body
    at = middle.index("message=fine")
    claimed_at = middle.index("lease_seconds=")
    assert middle.rindex("n=149", 0, claimed_at) < claimed_at < at < middle.index("n=150", at)
    oldest_link = re.search(r'href="\?timeline_before=(\d+)">older', body).group(1)
    oldest, body = page(f"?timeline_before={oldest_link}")
    assert "message=fine" not in oldest and "older</a>" not in body


def test_the_admin_page_of_a_job_its_agent_finished_shows_the_report(world, admin_client,
                                                                     claimed):
    job, claim = claimed
    lifecycle.report_status(job.id, claim, "failure", message="it broke",
                            job_agent_id=world.agent.id)
    body = admin_client.get(reverse("admin:jobqueue_job_change", args=[job.id])).content
    table = body.decode().split('class="jq-timeline"', 1)[1].split("</table>", 1)[0]
    assert "status reported" in table and "message=it broke" in table
    assert "2 of 2 events" in body.decode()  # the claim's, and the report read from the row


def test_a_schedule_fire_names_its_schedule_time_and_outcome():
    from jobqueue.models import ScheduleFire

    fire = ScheduleFire(schedule_id="00000000-0000-4000-8000-000000000001",
                        fire_time=dt.datetime(2026, 1, 2, 3, 4, tzinfo=dt.UTC),
                        outcome=ScheduleFire.MISSED)
    assert str(fire) == ("00000000-0000-4000-8000-000000000001 2026-01-02 03:04:00+00:00 "
                         "missed")


def test_the_job_page_reads_whether_a_stored_event_ended_the_claim_once(world, claimed):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    job, claim = claimed
    lifecycle.report_status(job.id, claim, "successful", job_agent_id=world.agent.id)
    with CaptureQueriesContext(connection) as seen:
        body = _detail(world, job.id)
    assert body["events"][-1]["kind"] == "status_reported"
    assert body["attempts"][-1]["outcome"] == "successful"
    endings = [q["sql"] for q in seen.captured_queries
               if '"job_event"."claim_id" =' in q["sql"]]
    assert len(endings) == 1, endings  # one look, for both the events and the attempts
