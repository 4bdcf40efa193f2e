"""Groups in the admin: the group column and filter, and "cancel the groups of the selected
jobs" (a confirmation page, then each group's cancel through the lifecycle, logged)."""

import logging

import pytest
from django.contrib.admin.models import LogEntry
from django.urls import reverse

from jobqueue import lifecycle, states
from jobqueue.models import Job, JobEvent, JobGroup
from tests.factories import JobAgentFactory

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:jobqueue_job_changelist"


@pytest.fixture
def grouped():
    agent = JobAgentFactory()
    jobs = {}
    for group in ("run-a", "run-b"):
        jobs[group] = [
            lifecycle.create_job(workspace=agent.workspace, job_agent=agent, group=group)[0]
            for _ in range(3)
        ]
    jobs[None] = [lifecycle.create_job(workspace=agent.workspace, job_agent=agent)[0]]
    lifecycle.claim_job(agent, jobs["run-a"][0].id)
    return jobs


def _action(client, *jobs, **extra):
    return client.post(reverse(CHANGELIST), {
        "action": "cancel_groups", "_selected_action": [str(j.id) for j in jobs], "index": 0,
        **extra,
    })


def test_the_list_filters_by_group(op_client, grouped):
    page = op_client.get(reverse(CHANGELIST), {"group": "run-b"})
    assert page.status_code == 200
    html = page.content.decode()
    assert all(str(j.id) in html for j in grouped["run-b"])
    assert not any(str(j.id) in html for j in grouped["run-a"] + grouped[None])
    # The filter offers the recent groups.
    assert "?group=run-a" in op_client.get(reverse(CHANGELIST)).content.decode()


def test_cancel_groups_asks_first_and_changes_nothing_until_confirmed(op_client, grouped):
    page = _action(op_client, grouped["run-a"][1])
    assert page.status_code == 200
    html = page.content.decode()
    assert "Cancel these groups?" in html and "run-a" in html and "run-b" not in html
    assert 'id="confirm-cancel-groups"' in html
    assert not Job.objects.filter(status=states.CANCELLED).exists()
    assert JobGroup.objects.get(name="run-a").cancelled_at is None


def test_confirmed_cancel_goes_through_the_lifecycle_and_is_logged(op_client, grouped, caplog):
    with caplog.at_level(logging.INFO, logger="jobqueue.admin"):
        r = _action(op_client, grouped["run-a"][1], grouped[None][0], confirm="yes")
    assert r.status_code == 302
    assert set(Job.objects.filter(group="run-a").values_list("status", flat=True)) == {
        states.CANCELLED}
    assert Job.objects.filter(group="run-b", status=states.QUEUED).count() == 3
    assert Job.objects.get(id=grouped[None][0].id).status == states.QUEUED
    group = JobGroup.objects.get(name="run-a")
    assert group.cancelled_at is not None and group.cancelled_by == "operator:olga"
    event = JobEvent.objects.filter(job_id=grouped["run-a"][0].id).order_by("-id").first()
    assert event.kind == JobEvent.CANCELLED and event.actor == "operator:olga"
    assert event.detail["superseded_claim"] is True
    entry = LogEntry.objects.get(object_id=str(group.pk))
    assert "3 job(s) cancelled" in entry.get_change_message()
    assert any("group=run-a" in rec.getMessage() for rec in caplog.records)


def test_cancel_groups_without_a_group_says_so(op_client, grouped):
    r = _action(op_client, grouped[None][0])
    assert r.status_code == 302
    page = op_client.get(reverse(CHANGELIST))
    assert "None of the selected jobs belongs to a group." in page.content.decode()
    assert not JobGroup.objects.filter(cancelled_at__isnull=False).exists()


def test_view_only_staff_cannot_cancel_groups(client, viewer, grouped):
    client.force_login(viewer)
    r = _action(client, grouped["run-a"][0], confirm="yes")
    assert r.status_code in (200, 302, 403)
    assert not JobGroup.objects.filter(cancelled_at__isnull=False).exists()
    assert not Job.objects.filter(status=states.CANCELLED).exists()
