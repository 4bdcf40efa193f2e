"""Schedules in the admin: listed with their last and next fires and their fires by outcome,
a page without the dispatch_context's values, pause and resume through the lifecycle (the
change permission) with a log entry."""

import datetime as dt

import pytest
from django.contrib.admin.models import LogEntry
from django.urls import reverse

from jobqueue.db import db_now
from jobqueue.lifecycle import schedules
from jobqueue.maintenance import schedules as service
from jobqueue.models import Schedule

from .conftest import SECRET

pytestmark = pytest.mark.django_db


@pytest.fixture
def schedule(agent):
    made = schedules.create_schedule(
        workspace=agent.workspace, name="nightly-report", cron_expr="30 2 * * *",
        timezone="Europe/Berlin", job_agent=agent,
        job={"dispatch_context": {"api_password": SECRET}, "priority": 4})
    Schedule.objects.filter(id=made.id).update(next_fire_at=db_now() - dt.timedelta(seconds=1))
    service.run_once()
    return Schedule.objects.get(id=made.id)


def _action(client, action, *items):
    return client.post(reverse("admin:jobqueue_schedule_changelist"),
                       {"action": action, "_selected_action": [str(s.id) for s in items],
                        "index": 0}, follow=True)


def test_schedules_are_listed_with_their_last_and_next_fires(op_client, schedule):
    page = op_client.get(reverse("admin:jobqueue_schedule_changelist"))
    assert page.status_code == 200
    text = page.content.decode()
    assert "nightly-report" in text and "30 2 * * *" in text and "Europe/Berlin" in text
    assert [s.pk for s in page.context["cl"].result_list] == [schedule.pk]
    row = page.context["cl"].result_list[0]
    assert row.last_fire_at is not None and row.next_fire_at > row.last_fire_at
    assert row.fired == 1
    assert SECRET not in text


def test_a_schedules_page_shows_its_job_fires_and_next_fires_but_no_secret(op_client,
                                                                              schedule):
    page = op_client.get(reverse("admin:jobqueue_schedule_change", args=[schedule.pk]))
    assert page.status_code == 200
    text = page.content.decode()
    assert SECRET not in text
    assert "api_password" in text and "priority" in text
    assert "fired" in text and text.count("+00:00") >= 5
    assert reverse("admin:jobqueue_schedule_add") not in text


def test_pause_and_resume_actions(op_client, schedule):
    _action(op_client, "pause", schedule)
    schedule.refresh_from_db()
    assert schedule.paused_at is not None
    _action(op_client, "resume", schedule)
    schedule.refresh_from_db()
    assert schedule.paused_at is None and schedule.next_fire_at > db_now()
    assert LogEntry.objects.filter(object_id=str(schedule.pk)).count() == 2


def test_a_viewer_can_read_but_not_pause(viewer_client, schedule):
    assert viewer_client.get(reverse("admin:jobqueue_schedule_changelist")).status_code == 200
    _action(viewer_client, "pause", schedule)
    schedule.refresh_from_db()
    assert schedule.paused_at is None
