"""What a job holds is bounded, and lists stay small whatever the jobs hold (#17 item 6).

- JOBQUEUE_MAX_MESSAGE_BYTES (64 KiB of UTF-8) and JOBQUEUE_MAX_RESULT_BYTES (1 MiB of
  compact JSON) hold on the single and the batch report: beyond is a 400 validation_error
  that changes nothing and never quotes what was sent;
- GET jobs answers summaries: no job_agent_config, result or message, not even loaded;
- the admin's job list never loads those columns either.
"""

import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from jobqueue import states
from jobqueue.conf import jobqueue_settings
from jobqueue.models import Job, JobEvent
from tests.factories import claimed_job

BULKY = ("result", "message", "job_agent_config", "dispatch_context")


def _is_validation_error(r, field):
    assert r.status_code == 400, (r.status_code, r.content[:300])
    body = r.json()
    assert body["code"] == "validation_error" and field in body["fields"]
    return body


@pytest.fixture
def small_caps(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "MAX_MESSAGE_BYTES": 100, "MAX_RESULT_BYTES": 200}


def test_the_defaults_are_64_kib_and_1_mib():
    conf = jobqueue_settings()
    assert conf["MAX_MESSAGE_BYTES"] == 64 * 1024
    assert conf["MAX_RESULT_BYTES"] == 1024 * 1024


def test_a_message_over_the_default_cap_is_refused_and_changes_nothing(world):
    job, grant = claimed_job(job_agent=world.agent)
    agent = world.agent_caller()
    limit = jobqueue_settings()["MAX_MESSAGE_BYTES"]
    over = "zq" + "é" * (limit // 2)  # limit + 2 bytes in UTF-8, limit // 2 + 2 characters
    r = agent.put(f"jobs/{job.id}/status", json={
        "claim_id": str(grant.claim_id), "status": "successful", "message": over})
    body = _is_validation_error(r, "message")
    assert "zq" not in r.content.decode() and "é" not in json.dumps(body, ensure_ascii=False)
    assert str(limit) in body["detail"]
    job.refresh_from_db()
    assert job.status == states.IN_PROGRESS and job.message == ""
    # Exactly the cap is fine.
    at_cap = "é" * (limit // 2)
    r = agent.put(f"jobs/{job.id}/status", json={
        "claim_id": str(grant.claim_id), "status": "successful", "message": at_cap})
    assert r.status_code == 200, r.content[:300]
    job.refresh_from_db()
    assert job.status == states.SUCCESSFUL and job.message == at_cap


@pytest.mark.parametrize("status", ["in_progress", "failure"])
def test_a_result_over_the_cap_is_refused_on_progress_and_terminal_reports(
        world, small_caps, status):
    job, grant = claimed_job(job_agent=world.agent)
    agent = world.agent_caller()
    # {"k":"…"} is 8 bytes of JSON around the string.
    over = {"k": "zq" + "x" * 191}
    r = agent.put(f"jobs/{job.id}/status", json={
        "claim_id": str(grant.claim_id), "status": status, "result": over})
    body = _is_validation_error(r, "result")
    assert "zq" not in r.content.decode() and "200 bytes" in body["detail"]
    job.refresh_from_db()
    assert job.status == states.IN_PROGRESS and job.result is None
    # Whitespace in the request does not count: the compact JSON does.
    at_cap = {"k": "x" * 192}
    raw = json.dumps({"claim_id": str(grant.claim_id), "status": status, "result": at_cap},
                     indent=8)
    r = agent.put(f"jobs/{job.id}/status", raw=raw)
    assert r.status_code == 200, r.content[:300]
    job.refresh_from_db()
    assert job.result == at_cap


def test_a_progress_message_over_the_cap_is_refused(world, small_caps):
    job, grant = claimed_job(job_agent=world.agent)
    r = world.agent_caller().put(f"jobs/{job.id}/status", json={
        "claim_id": str(grant.claim_id), "status": "in_progress", "message": "m" * 101})
    _is_validation_error(r, "message")
    job.refresh_from_db()
    assert job.message == "" and job.status == states.IN_PROGRESS


def test_a_batch_with_one_report_over_a_cap_ends_nothing(world, small_caps):
    claimed = [claimed_job(job_agent=world.agent) for _ in range(3)]
    events_before = JobEvent.objects.count()
    agent = world.agent_caller()
    path = f"job-agents/{world.agent.id}/reports"

    def reports(big):
        return {"reports": [
            {"job_id": str(job.id), "claim_id": str(grant.claim_id), "status": "successful",
             **(big if i == 1 else {"message": "ok"})}
            for i, (job, grant) in enumerate(claimed)
        ]}

    for big, field in (({"message": "zq" * 51}, "message"),
                       ({"result": ["zq" * 100]}, "result")):
        r = agent.post(path, json=reports(big))
        _is_validation_error(r, field)
        assert "zq" not in r.content.decode()
        assert set(Job.objects.values_list("status", flat=True)) == {states.IN_PROGRESS}
        assert JobEvent.objects.count() == events_before
    r = agent.post(path, json=reports({"message": "m" * 100, "result": ["r" * 196]}))
    assert r.status_code == 200 and all(x["accepted"] for x in r.json()["results"])
    assert set(Job.objects.values_list("status", flat=True)) == {states.SUCCESSFUL}


def _maximal_jobs(world, n):
    """n finished jobs holding the most a job can: message and result at their caps (the
    result's cap lowered to keep the database small), long external ids and keys."""
    conf = jobqueue_settings()
    message = "é" * (conf["MAX_MESSAGE_BYTES"] // 2)
    result = {"k": "r" * (conf["MAX_RESULT_BYTES"] - 8)}
    config = {"command": ["c" * 60_000]}
    Job.objects.bulk_create([
        Job(workspace=world.workspace, job_agent=world.agent, status=states.SUCCESSFUL,
            max_attempts=3, initial_max_attempts=3, attempt=1, message=message, result=result,
            job_agent_config=config, dispatch_context={"secret": "s" * 1000},
            external_id=f"{i:0>255}", idempotency_key=f"{i:k>255}",
            started_at=timezone.now(), completed_at=timezone.now())
        for i in range(n)
    ])


def test_a_page_of_500_maximal_jobs_is_small_and_loads_no_bulky_column(world, settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "MAX_RESULT_BYTES": 64 * 1024}
    _maximal_jobs(world, 500)
    producer = world.producer()
    with CaptureQueriesContext(connection) as queries:
        r = producer.get("jobs?page_size=500")
    assert r.status_code == 200
    page = r.json()["results"]
    assert len(page) == 500
    # About 1 KB a job (two 255-character ids among them), whatever the job holds:
    # measured 0.47 MiB for the page.
    assert len(r.content) < 1024 * 1024, len(r.content)
    assert not set(BULKY) & set(page[0])
    job_selects = [q["sql"] for q in queries.captured_queries if 'FROM "job"' in q["sql"]]
    assert job_selects
    for sql in job_selects:
        for column in BULKY:
            assert f'"job"."{column}"' not in sql, (column, sql[:500])
    # The detail still has them.
    detail = producer.get(f"jobs/{page[0]['id']}").json()
    assert detail["message"] and detail["result"] and detail["job_agent_config"]


def test_the_admin_job_list_never_loads_the_bulky_columns(world, admin_client):
    _maximal_jobs(world, 40)
    with CaptureQueriesContext(connection) as queries:
        r = admin_client.get(reverse("admin:jobqueue_job_changelist"))
    assert r.status_code == 200
    assert r.content.count(b'class="action-select"') == 40
    job_selects = [q["sql"] for q in queries.captured_queries
                   if 'FROM "job"' in q["sql"] and q["sql"].lstrip().upper().startswith("SELECT")]
    assert job_selects
    for sql in job_selects:
        for column in BULKY:
            assert f'"job"."{column}"' not in sql, (column, sql[:500])
    # ... and the page is small: 40 jobs of ~1.2 MB each do not reach it.
    assert len(r.content) < 512 * 1024, len(r.content)
    # A job's own page still shows its message and result.
    job = Job.objects.first()
    page = admin_client.get(reverse("admin:jobqueue_job_change", args=[job.id]))
    assert page.status_code == 200
    assert "éééé" in page.content.decode() and "rrrr" in page.content.decode()
