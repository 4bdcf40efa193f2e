"""The Recovery page: what is stuck, what ended expired, who went quiet, and the reaper."""

import pytest
from django.urls import reverse

from jobqueue.maintenance import reaper
from jobqueue.models import JobAgent, ReaperRun
from tests.factories import JobAgentFactory

pytestmark = pytest.mark.django_db

URL = "admin:jobqueue_job_recovery"


def section(html, section_id):
    start = html.index(f'id="{section_id}"')
    end = html.find('<div class="jq-section"', start)
    return html[start: end if end != -1 else None]


def test_counts_by_status(op_client, jobs):
    html = section(op_client.get(reverse(URL)).content.decode(), "status-counts")
    # Queued 2, in progress 2, successful 1, expired 1, others 0, in states.CHOICES order.
    cells = [c.split(">")[1].split("<")[0] for c in html.split('status__exact=')[1:]]
    assert cells == ["0", "2", "2", "1", "0", "0", "1"]


def test_expired_leases_not_yet_reaped(op_client, jobs):
    html = section(op_client.get(reverse(URL)).content.decode(), "expired-leases")
    assert "(1)" in html and str(jobs["stuck"].id) in html
    assert str(jobs["healthy"].id) not in html
    assert "requeue" in html  # attempt 1 of 3: the reaper will requeue it


def test_recently_expired_jobs(op_client, jobs):
    html = section(op_client.get(reverse(URL)).content.decode(), "recently-expired")
    assert str(jobs["dead"].id) in html and "(1)" in html
    assert "?status__exact=expired" in html


def test_agents_not_seen(op_client, jobs, agent):
    from django.db.models.functions import Now

    from jobqueue.db import NowPlusSeconds

    quiet = JobAgentFactory(name="quiet-agent", lease_seconds=10)
    JobAgent.objects.filter(pk=quiet.pk).update(last_seen_at=NowPlusSeconds(-31))
    JobAgent.objects.filter(pk=agent.pk).update(last_seen_at=Now())
    html = section(op_client.get(reverse(URL)).content.decode(), "unseen-agents")
    assert "quiet-agent" in html and "31\xa0seconds ago" in html
    assert agent.name not in html  # seen just now


def test_reaper_warning_when_it_never_ran(op_client, agent):
    assert not ReaperRun.objects.exists()
    html = op_client.get(reverse(URL)).content.decode()
    assert 'id="reaper-stale"' in html and "last run: never" in html


def test_reaper_runs_and_no_warning_after_a_recent_run(op_client, jobs, settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "REAPER_STALE_AFTER_SECONDS": 300}
    reaper.sweep()
    html = op_client.get(reverse(URL)).content.decode()
    assert 'id="reaper-stale"' not in html
    runs = section(html, "reaper-runs")
    # The fixture's sweep (1 expired) and this one (1 requeued: the stuck job).
    assert runs.count("<tr><td>") == 2


def test_reaper_warning_when_the_last_run_is_too_old(op_client, jobs, settings):
    from jobqueue.db import NowPlusSeconds

    settings.JOBQUEUE = {**settings.JOBQUEUE, "REAPER_STALE_AFTER_SECONDS": 60}
    ReaperRun.objects.update(started_at=NowPlusSeconds(-120), finished_at=NowPlusSeconds(-120))
    html = op_client.get(reverse(URL)).content.decode()
    assert 'id="reaper-stale"' in html and "longer than 1\xa0minute" in html
