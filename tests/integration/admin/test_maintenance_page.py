"""The Recovery page's maintenance section: when each service last ran, what it did, and a
failure that came after it; and the read-only maintenance_run admin."""

import pytest
from django.urls import reverse

from jobqueue.db import NowPlusSeconds
from jobqueue.maintenance import pruner, reaper, run_records
from jobqueue.models import MaintenanceRun

pytestmark = pytest.mark.django_db


def section(html):
    start = html.index('id="maintenance"')
    return html[start: html.index('<div class="jq-section"', start)]


def rows(html):
    return {cells[0]: cells[1:] for cells in (
        [c.split("<")[0] for c in row.split("<td>")[1:]]
        for row in section(html).split("<tr>")[2:])}


def test_services_that_never_ran(op_client):
    got = rows(op_client.get(reverse("admin:jobqueue_job_recovery")).content.decode())
    assert set(got) == {"reaper", "schedules", "group_watcher", "webhooks", "pruner",
                        "artifact_cleaner"}
    assert got["reaper"][:2] == ["never", "never ran"]
    assert got["pruner"][:2] == ["never", "never ran"]


def test_last_runs_and_a_later_failure(op_client):
    reaper.sweep()
    pruner.run_once()
    MaintenanceRun.objects.update(finished_at=NowPlusSeconds(-60))  # times apart, whatever
    run_records.record_error("pruner", "OperationalError: the database went away")  # the clock
    html = op_client.get(reverse("admin:jobqueue_job_recovery")).content.decode()
    got = rows(html)
    assert got["reaper"][1] == "requeued 0, expired 0" and got["reaper"][0].endswith("ago")
    assert got["pruner"][1] == "jobs 0, batches 0"
    assert got["pruner"][4] == "OperationalError: the database went away"
    assert got["reaper"][4] == ""
    MaintenanceRun.objects.exclude(error="").update(finished_at=NowPlusSeconds(-30))
    pruner.run_once()  # a run after the failure: the failure is history
    assert rows(op_client.get(reverse("admin:jobqueue_job_recovery")).content.decode(
    ))["pruner"][4] == ""


def test_the_maintenance_run_admin_is_read_only(op_client):
    run = MaintenanceRun.objects.get(id=pruner.run_once().run_id)
    listing = op_client.get(reverse("admin:jobqueue_maintenancerun_changelist"))
    assert listing.status_code == 200 and "pruner" in listing.content.decode()
    page = op_client.get(reverse("admin:jobqueue_maintenancerun_change", args=[run.id]))
    assert page.status_code == 200 and "batches" in page.content.decode()
    assert op_client.get(reverse("admin:jobqueue_maintenancerun_add")).status_code == 403
    assert op_client.post(reverse("admin:jobqueue_maintenancerun_delete", args=[run.id]),
                          {"post": "yes"}).status_code == 403
    assert MaintenanceRun.objects.filter(id=run.id).exists()
