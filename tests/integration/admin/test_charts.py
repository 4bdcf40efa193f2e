"""The Recovery page's charts and the admin index's "Needs attention" panel: what they count,
from the jobs and their events, by the database's clock, in a fixed number of grouped
queries."""

import datetime as dt
import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from jobqueue import lifecycle, states
from jobqueue.admin import charts
from jobqueue.db import NowPlusSeconds, db_now
from jobqueue.models import Job, JobEvent
from tests.factories import JobAgentFactory, JobFactory, claimed_job

from .conftest import expire_lease

pytestmark = pytest.mark.django_db


def _shift(job_ids, seconds, **filters):
    JobEvent.objects.filter(job_id__in=job_ids, **filters).update(
        created_at=NowPlusSeconds(seconds)
    )


def _create(agent, **kwargs):
    return lifecycle.create_job(workspace=agent.workspace, job_agent=agent, **kwargs)[0]


def _finish(agent, status):
    job, grant = claimed_job(job_agent=agent)
    lifecycle.report_status(job.id, grant.claim_id, status)
    return job


def test_finished_per_minute_counts_each_terminal_status_in_its_minute():
    agent = JobAgentFactory(max_attempts=1)
    ok = [_finish(agent, states.SUCCESSFUL) for _ in range(3)]
    failed = _finish(agent, states.FAILURE)
    cancelled = lifecycle.cancel_job(JobFactory(job_agent=agent).id)
    lost, _ = claimed_job(job_agent=agent)
    expire_lease(lost, seconds_ago=5)
    assert lifecycle.reap_expired_claims_once(10).expired == 1
    marked = lifecycle.mark_failed(JobFactory(job_agent=agent).id, actor="operator:olga")
    # Two successes five hours ago, one long ago (outside the 24 hours): read from the jobs
    # (an agent's final report is the job row's, jobqueue/timeline.py).
    for ids, seconds in (([ok[0].id, ok[1].id], -5 * 3600), ([ok[2].id], -25 * 3600)):
        Job.objects.filter(id__in=ids).update(completed_at=NowPlusSeconds(seconds))

    now = db_now()
    data = charts.finished_per_minute(now)
    quarter = now.replace(minute=now.minute - now.minute % 15, second=0, microsecond=0)
    assert len(data["starts"]) == 96 and data["starts"][-1] == quarter
    assert data["starts"][0] == quarter - dt.timedelta(hours=24) + dt.timedelta(minutes=15)
    series = data["series"]
    assert sum(series[states.SUCCESSFUL]) == 2
    assert sum(series[states.FAILURE]) == 2  # an agent's report and an operator's mark-failed
    assert sum(series[states.CANCELLED]) == 1 and sum(series[states.EXPIRED]) == 1
    five_ago = quarter - dt.timedelta(hours=5)  # the same minute of the hour: that quarter
    assert series[states.SUCCESSFUL][data["starts"].index(five_ago)] == 2
    assert series[states.FAILURE][-1] + series[states.FAILURE][-2] == 2
    del failed, cancelled, marked

    svg = charts.finished_chart_svg(data)
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    counts = re.findall(r'data-status="(\w+)" data-count="(\d+)"', svg)
    assert sum(int(n) for s, n in counts if s == states.SUCCESSFUL) == 2
    assert {s for s, _ in counts} == {states.SUCCESSFUL, states.FAILURE, states.CANCELLED,
                                       states.EXPIRED}


def test_queue_depth_is_read_back_from_the_events():
    agent = JobAgentFactory()
    early = [_create(agent) for _ in range(2)]
    _shift([j.id for j in early], -3 * 3600, kind=JobEvent.CREATED)
    later = [_create(agent) for _ in range(3)]
    lifecycle.claim_job(agent, later[0].id)
    # A release puts a job back, a cancel of a queued job takes one out.
    job = _create(agent)
    grant = lifecycle.claim_job(agent, job.id)
    lifecycle.release_job(job.id, grant.claim_id)
    lifecycle.cancel_job(later[1].id)
    queued = Job.objects.filter(status=states.QUEUED).count()
    assert queued == 4  # early x2, later[2], the released one

    now = db_now()
    data = charts.queue_depth(now)
    depth = data["depth"]
    assert len(depth) == 24 and data["ends"][-1] == now
    assert depth[-1] == queued
    three_ago = (now - dt.timedelta(hours=3)).replace(minute=0, second=0, microsecond=0)
    i = [e - dt.timedelta(hours=1) for e in data["ends"][:-1]].index(three_ago)
    assert depth[i] == 2 and depth[i - 1] == 0 and set(depth[i:-1]) == {2}
    svg = charts.depth_chart_svg(data)
    assert [int(d) for d in re.findall(r'data-depth="(\d+)"', svg)] == depth


def test_queue_depth_counts_held_jobs_when_dispatched_not_when_created():
    agent = JobAgentFactory()
    held = _create(agent, hold=True)
    assert charts.queue_depth(db_now())["depth"][-1] == 0
    lifecycle.dispatch_job(held.id)
    assert charts.queue_depth(db_now())["depth"][-1] == 1
    assert charts._queue_delta(JobEvent.CREATED, "pending", None) == 0
    assert charts._queue_delta(JobEvent.CANCELLED, None, "true") == 0
    assert charts._queue_delta(JobEvent.CANCELLED, None, False) == -1
    assert charts._queue_delta(JobEvent.STATUS_REPORTED, "successful", None) == 0


def test_the_charts_cost_a_fixed_number_of_queries(op_client):
    agent = JobAgentFactory()
    for _ in range(3):
        _finish(agent, states.SUCCESSFUL)
    now = db_now()
    with CaptureQueriesContext(connection) as few:
        charts.charts_context(now)
    for _ in range(30):
        _finish(agent, states.FAILURE)
    now = db_now()
    with CaptureQueriesContext(connection) as many:
        charts.charts_context(now)
    # finished, depth events, the claims the job rows say, queued count
    assert len(few) == len(many) == 4
    # Grouped in the database: one row per bucket and kind, never one per event.
    assert all("GROUP BY" in q["sql"] for q in many.captured_queries[:3])


@pytest.mark.postgres_only
def test_the_event_time_index_exists_on_postgresql():
    with connection.cursor() as cur:
        cur.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'job_event_created_brin'")
        (definition,) = cur.fetchone()
    assert "USING brin (created_at)" in definition


def test_the_recovery_page_draws_both_charts(op_client):
    agent = JobAgentFactory()
    _finish(agent, states.SUCCESSFUL)
    JobFactory(job_agent=agent)
    html = op_client.get(reverse("admin:jobqueue_job_recovery")).content.decode()
    assert html.count('class="jq-chart"') == 2
    assert 'data-status="successful" data-count="1"' in html
    assert "Queued jobs, last 24 hours (now: 1)" in html


def test_the_admin_index_links_the_recovery_page_with_what_needs_attention(op_client):
    agent = JobAgentFactory(lease_seconds=30)
    stuck, _ = claimed_job(job_agent=agent)
    expire_lease(stuck, seconds_ago=40)
    lifecycle.pause_job_agent(agent, "operator:olga")
    html = op_client.get(reverse("admin:index")).content.decode()
    recovery = reverse("admin:jobqueue_job_recovery")
    assert f'href="{recovery}"' in html and "Needs attention" in html

    def count(item):
        row = re.search(rf'id="attention-{item}".*?<strong>(\d+)</strong>', html, re.S)
        return int(row[1])

    assert count("expired-leases") == 1 and count("paused-agents") == 1
    assert count("orphans") == 0 and count("reaper-stale") == 1  # the reaper never ran
    assert count("unseen-agents") == 1  # never seen
    assert 'class="jq-alarm"' in html and "All clear." not in html


def test_the_panel_says_all_clear_when_nothing_needs_attention(op_client):
    from jobqueue.maintenance import reaper

    reaper.sweep()
    html = op_client.get(reverse("admin:index")).content.decode()
    assert "All clear." in html


def test_the_panel_is_not_shown_without_the_job_view_permission(client, django_user_model):
    user = django_user_model.objects.create_user("sam", "sam@example.com", None)
    user.is_staff = True
    user.save()
    client.force_login(user)
    html = client.get(reverse("admin:index")).content.decode()
    assert "Needs attention" not in html


def test_events_after_the_charts_now_are_not_counted():
    """The page reads the database's clock once; an event written after it (while the page
    renders) falls after the last bucket and is left out."""
    agent = JobAgentFactory(max_attempts=1)
    earlier = db_now() - dt.timedelta(hours=2)
    _finish(agent, states.SUCCESSFUL)
    assert sum(map(sum, charts.finished_per_minute(earlier)["series"].values())) == 0
    assert sum(charts.queue_depth(earlier)["depth"]) == 0
    assert sum(charts.finished_per_minute(db_now())["series"][states.SUCCESSFUL]) == 1


def test_the_database_clock_is_read_once_per_request(django_assert_num_queries):
    from types import SimpleNamespace

    from jobqueue.admin.common import request_db_now

    request = SimpleNamespace()
    first = request_db_now(request)
    with django_assert_num_queries(0):
        assert request_db_now(request) is first
