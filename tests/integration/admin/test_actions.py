"""Operator actions go through the lifecycle, leave a job event naming the operator and an
admin log entry, and need the change permission."""

import pytest
from django.contrib.admin.models import LogEntry
from django.urls import reverse

from jobqueue import lifecycle, states
from jobqueue.models import Job, JobClaim, JobEvent, ReaperRun

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:jobqueue_job_changelist"


def run_action(client, action, *jobs):
    return client.post(
        reverse(CHANGELIST),
        {"action": action, "_selected_action": [str(j.id) for j in jobs], "index": 0},
        follow=True,
    )


def last_event(job):
    return JobEvent.objects.filter(job_id=job.id).order_by("-id").first()


def test_requeue_an_expired_job(op_client, jobs):
    dead = jobs["dead"]
    response = run_action(op_client, "requeue_jobs", dead)
    assert "Requeued 1 job(s)." in response.content.decode()
    dead.refresh_from_db()
    assert dead.status == states.QUEUED
    assert dead.max_attempts == dead.attempt + dead.initial_max_attempts
    event = last_event(dead)
    assert event.kind == JobEvent.REQUEUED and event.actor == "operator:olga"
    log = LogEntry.objects.get(object_id=str(dead.id))
    assert log.user.username == "olga" and "Requeued by operator:olga" in log.get_change_message()


def test_requeue_supersedes_a_live_claim(op_client, jobs):
    from jobqueue.exceptions import ClaimSuperseded

    job = jobs["healthy"]
    job.refresh_from_db()
    old_claim = job.last_claim_id
    run_action(op_client, "requeue_jobs", job)
    job.refresh_from_db()
    assert job.status == states.QUEUED and not JobClaim.objects.filter(job=job).exists()
    with pytest.raises(ClaimSuperseded):
        lifecycle.heartbeat(job.id, old_claim)


def test_cancel(op_client, jobs):
    job = jobs["queued"]
    response = run_action(op_client, "cancel_jobs", job)
    assert "Cancelled 1 job(s)." in response.content.decode()
    job.refresh_from_db()
    assert job.status == states.CANCELLED
    assert last_event(job).kind == JobEvent.CANCELLED
    assert last_event(job).actor == "operator:olga"
    assert LogEntry.objects.filter(object_id=str(job.id)).count() == 1


def test_mark_failed_ends_a_stuck_job_and_its_claim(op_client, jobs):
    job = jobs["stuck"]
    run_action(op_client, "mark_jobs_failed", job)
    job.refresh_from_db()
    assert job.status == states.FAILURE and job.completed_at is not None
    assert not JobClaim.objects.filter(job=job).exists()
    event = last_event(job)
    assert event.actor == "operator:olga" and event.detail["status"] == states.FAILURE
    assert LogEntry.objects.filter(object_id=str(job.id)).exists()


def test_an_action_that_does_not_apply_changes_nothing_and_says_so(op_client, jobs):
    done, queued = jobs["done"], jobs["queued"]
    events_before = JobEvent.objects.filter(job=done).count()
    response = run_action(op_client, "cancel_jobs", done, queued)
    html = response.content.decode()
    assert "Cancelled 1 job(s)." in html
    assert "1 job(s) left unchanged" in html and str(done.id) in html
    done.refresh_from_db()
    assert done.status == states.SUCCESSFUL
    assert JobEvent.objects.filter(job=done).count() == events_before
    assert not LogEntry.objects.filter(object_id=str(done.id)).exists()


def test_reap_now_confirms_then_sweeps_as_the_operator(op_client, jobs):
    stuck = jobs["stuck"]
    url = reverse("admin:jobqueue_job_reap")
    page = op_client.get(url).content.decode()
    assert 'id="would-requeue">1<' in page and 'id="would-expire">0<' in page
    stuck.refresh_from_db()
    assert stuck.status == states.IN_PROGRESS  # GET changes nothing
    runs_before = ReaperRun.objects.count()

    response = op_client.post(url, follow=True)
    assert response.redirect_chain[-1][0] == reverse("admin:jobqueue_job_recovery")
    assert "1 job(s) requeued, 0 expired" in response.content.decode()
    stuck.refresh_from_db()
    assert stuck.status == states.QUEUED
    event = last_event(stuck)
    assert event.kind == JobEvent.REAPED and event.actor == "operator:olga"
    assert ReaperRun.objects.count() == runs_before + 1
    run = ReaperRun.objects.order_by("-id").first()
    assert run.requeued == 1
    log = LogEntry.objects.get(object_id=str(run.pk))
    assert log.user.username == "olga" and "requeued 1" in log.get_change_message()


def test_reap_now_refuses_other_methods(op_client):
    assert op_client.put(reverse("admin:jobqueue_job_reap")).status_code == 405


# --- view-only staff -------------------------------------------------------------------------


def test_view_only_staff_can_look(viewer_client, jobs):
    for url in [
        reverse(CHANGELIST),
        reverse(CHANGELIST) + "?lease=expired",
        reverse("admin:jobqueue_job_change", args=[jobs["stuck"].pk]),
        reverse("admin:jobqueue_job_recovery"),
        reverse("admin:jobqueue_jobagent_changelist"),
        reverse("admin:jobqueue_reaperrun_changelist"),
        reverse("admin:agents_agenttoken_changelist"),
    ]:
        assert viewer_client.get(url).status_code == 200, url


def test_view_only_staff_see_no_actions_or_reap_button(viewer_client, jobs):
    html = viewer_client.get(reverse(CHANGELIST)).content.decode()
    assert "requeue_jobs" not in html and 'name="action"' not in html
    assert reverse("admin:jobqueue_job_reap") not in html
    recovery = viewer_client.get(reverse("admin:jobqueue_job_recovery")).content.decode()
    assert reverse("admin:jobqueue_job_reap") not in recovery


@pytest.mark.parametrize("action", ["requeue_jobs", "cancel_jobs", "mark_jobs_failed"])
def test_view_only_staff_cannot_act(viewer_client, jobs, action):
    stuck = jobs["stuck"]
    events_before = JobEvent.objects.filter(job=stuck).count()
    run_action(viewer_client, action, stuck)
    stuck.refresh_from_db()
    assert stuck.status == states.IN_PROGRESS
    assert JobEvent.objects.filter(job=stuck).count() == events_before
    assert not LogEntry.objects.exists()


def test_view_only_staff_cannot_reap(viewer_client, jobs):
    url = reverse("admin:jobqueue_job_reap")
    assert viewer_client.get(url).status_code == 403
    assert viewer_client.post(url).status_code == 403
    jobs["stuck"].refresh_from_db()
    assert jobs["stuck"].status == states.IN_PROGRESS


def test_staff_without_job_permissions_see_nothing(client, django_user_model, jobs):
    user = django_user_model.objects.create_user("nobody", password=None)
    user.is_staff = True
    user.save()
    client.force_login(user)
    assert client.get(reverse(CHANGELIST)).status_code == 403
    assert client.get(reverse("admin:jobqueue_job_recovery")).status_code == 403


def test_anonymous_is_sent_to_login(client, jobs):
    for url in [reverse("admin:jobqueue_job_recovery"), reverse("admin:jobqueue_job_reap")]:
        response = client.get(url)
        assert response.status_code == 302 and "/admin/login/" in response["Location"]


def test_staff_with_change_permission_can_act(client, viewer, jobs):
    from django.contrib.auth.models import Permission

    viewer.user_permissions.add(Permission.objects.get(codename="change_job"))
    client.force_login(viewer)
    run_action(client, "requeue_jobs", jobs["dead"])
    jobs["dead"].refresh_from_db()
    assert jobs["dead"].status == states.QUEUED
    assert last_event(jobs["dead"]).actor == "operator:vera"


# --- orphans: the invariant the Recovery page shouts about -------------------------------------


def test_orphans_are_shown_loudly_and_can_be_repaired(op_client, jobs):
    url = reverse("admin:jobqueue_job_recovery")
    assert 'id="orphans-alarm"' not in op_client.get(url).content.decode()
    # Test setup breaks invariant 2 by hand (no code path does this).
    orphan = jobs["queued"]
    Job.objects.filter(id=orphan.id).update(status=states.IN_PROGRESS)
    html = op_client.get(url).content.decode()
    assert 'id="orphans-alarm"' in html and "1 job(s) are in_progress without a claim" in html
    assert str(orphan.id) in html
    run_action(op_client, "mark_jobs_failed", orphan)
    orphan.refresh_from_db()
    assert orphan.status == states.FAILURE
    assert 'id="orphans-alarm"' not in op_client.get(url).content.decode()


def test_buttons_on_a_jobs_page_run_the_actions(op_client, viewer, jobs):
    from django.test import Client

    stuck = jobs["stuck"]
    page = reverse("admin:jobqueue_job_change", args=[stuck.pk])
    html = op_client.get(page).content.decode()
    assert 'value="mark_jobs_failed"' in html and 'value="requeue_jobs"' in html
    viewer_client = Client()
    viewer_client.force_login(viewer)
    assert 'value="requeue_jobs"' not in viewer_client.get(page).content.decode()
    form_action = reverse(CHANGELIST) + f"?q={stuck.pk}"
    assert f'action="{form_action}"' in html
    response = op_client.post(
        form_action,
        {"action": "mark_jobs_failed", "_selected_action": str(stuck.pk), "index": 0},
        follow=True,
    )
    assert "Marked failed 1 job(s)." in response.content.decode()
    assert [j.pk for j in response.context["cl"].result_list] == [stuck.pk]
    stuck.refresh_from_db()
    assert stuck.status == states.FAILURE
    assert last_event(stuck).actor == "operator:olga"


def test_cancelling_a_cancelled_job_is_reported_as_unchanged(op_client, jobs):
    job = jobs["queued"]
    run_action(op_client, "cancel_jobs", job)
    events = JobEvent.objects.filter(job=job).count()
    response = run_action(op_client, "cancel_jobs", job)
    assert "already cancelled" in response.content.decode()
    assert JobEvent.objects.filter(job=job).count() == events
    assert LogEntry.objects.filter(object_id=str(job.id)).count() == 1
