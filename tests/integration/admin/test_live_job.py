"""The live job page's endpoint (`<job>/live/`): what a running job's page swaps in without a
reload, rendered exactly as a reload would render it, redaction of the dispatch_context's
secrets included; staff with the view permission only. The browser side (the page polls and
stops once the job ended) is in test_browser.py."""

import re

import pytest
from django.urls import reverse

from jobqueue import lifecycle, states
from jobqueue.lifecycle import logs
from tests.factories import JobFactory

from .conftest import SECRET

pytestmark = pytest.mark.django_db


def live_url(job):
    return reverse("admin:jobqueue_job_live", args=[job.pk])


def readonly(page: str, name: str) -> str:
    """The rendered content of one read-only field of a change page."""
    match = re.search(rf'field-{name}\b.*?<div class="readonly">(.*?)</div>\s*</div>', page,
                      re.S)
    assert match, name
    return match[1]


def test_the_live_fields_are_what_a_reload_shows(op_client, agent):
    job = JobFactory(job_agent=agent, dispatch_context={"api_password": SECRET})
    page = op_client.get(reverse("admin:jobqueue_job_change", args=[job.pk])).content.decode()
    assert 'data-state="live"' in page and live_url(job) in page
    grant = lifecycle.claim_job(agent, job.id)
    logs.append_log(job.id, grant.claim_id, f"step 1 <b> using {SECRET}\n".encode())
    lifecycle.report_status(job.id, grant.claim_id, states.IN_PROGRESS,
                            message=f"half done with {SECRET}")
    answer = op_client.get(live_url(job))
    assert answer.status_code == 200 and answer["Content-Type"] == "application/json"
    assert "no-cache" in answer["Cache-Control"]
    data = answer.json()
    assert data["status"] == states.IN_PROGRESS and data["terminal"] is False
    assert "1 / 3" in data["fields"]["attempts"]
    assert "step 1 &lt;b&gt; using [redacted]" in data["fields"]["logs_display"]
    assert data["fields"]["message_display"] == "half done with [redacted]"
    assert SECRET not in answer.content.decode()
    assert str(grant.claim_id) not in answer.content.decode()  # never the fencing token
    reload = op_client.get(reverse("admin:jobqueue_job_change", args=[job.pk])).content.decode()
    for name in ("status", "attempts", "logs_display", "attempt_history", "started_at",
                 "message_display"):
        assert data["fields"][name] == readonly(reload, name).strip(), name


def test_a_finished_job_says_terminal_and_its_page_does_not_poll(op_client, agent):
    job = JobFactory(job_agent=agent)
    grant = lifecycle.claim_job(agent, job.id)
    lifecycle.report_status(job.id, grant.claim_id, states.FAILURE, message="boom\nline 2")
    data = op_client.get(live_url(job)).json()
    assert data["terminal"] is True and data["status"] == states.FAILURE
    assert data["fields"]["status"] == "Failure"
    assert data["fields"]["message_display"] == "boom<br>line 2"
    page = op_client.get(reverse("admin:jobqueue_job_change", args=[job.pk])).content.decode()
    assert 'data-state="final"' in page and 'id="jq-live"' not in page


def test_view_only_staff_may_watch(viewer_client, agent):
    job = JobFactory(job_agent=agent)
    assert viewer_client.get(live_url(job)).status_code == 200


def test_others_may_not(client, django_user_model, agent):
    job = JobFactory(job_agent=agent, dispatch_context={"api_password": SECRET})
    anonymous = client.get(live_url(job))
    assert anonymous.status_code == 302 and "/admin/login/" in anonymous["Location"]
    staff = django_user_model.objects.create_user("sam", "sam@example.com", None,
                                                  is_staff=True)
    client.force_login(staff)  # staff without the view permission on jobs
    refused = client.get(live_url(job))
    assert refused.status_code == 403 and refused.json()["code"] == "permission_denied"
    assert SECRET not in refused.content.decode()


def test_unknown_and_malformed_jobs_and_other_methods(op_client, agent):
    for job_id in ("00000000-0000-4000-8000-000000000000", "not-a-uuid"):
        missing = op_client.get(reverse("admin:jobqueue_job_live", args=[job_id]))
        assert missing.status_code == 404 and missing.json()["code"] == "not_found"
    job = JobFactory(job_agent=agent)
    posted = op_client.post(live_url(job))
    assert posted.status_code == 405 and posted["Allow"] == "GET"
    assert JobFactory._meta.model.objects.get(pk=job.pk).status == job.status
