"""/metrics moves as jobs are claimed, heartbeat, reported, reaped and refused."""

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jobqueue import lifecycle, observe, states
from jobqueue.db import NowPlusSeconds
from jobqueue.exceptions import ClaimSuperseded, JobFinished
from jobqueue.maintenance import reaper
from jobqueue.models import JobClaim
from tests.factories import JobAgentFactory, JobFactory

pytestmark = pytest.mark.django_db


def scrape(client) -> dict:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")
    values = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


def value(values, name, **labels) -> float:
    return values.get((name, tuple(sorted((k, str(v)) for k, v in labels.items()))), 0.0)


def test_metrics_move_with_the_queue(client):
    agent = JobAgentFactory(lease_seconds=60, max_attempts=1)
    aid = str(agent.id)
    for _ in range(3):
        JobFactory(job_agent=agent, dispatch_context={"token": "never-in-metrics"})
    before = scrape(client)
    assert value(before, "jobqueue_jobs", status="queued", job_agent_id=aid) == 3
    assert value(before, "jobqueue_database_up") == 1

    # Claims and heartbeats.
    grants = lifecycle.claim_next_jobs(agent, 2)
    lifecycle.heartbeat(grants[0].job.id, grants[0].claim_id, job_agent_id=agent.id)
    after_claim = scrape(client)
    assert value(after_claim, "jobqueue_claims_total", job_agent_id=aid) - value(
        before, "jobqueue_claims_total", job_agent_id=aid) == 2
    assert value(after_claim, "jobqueue_heartbeats_total", job_agent_id=aid) - value(
        before, "jobqueue_heartbeats_total", job_agent_id=aid) == 1
    assert value(after_claim, "jobqueue_jobs", status="in_progress", job_agent_id=aid) == 2
    assert value(after_claim, "jobqueue_jobs", status="queued", job_agent_id=aid) == 1
    assert value(after_claim, "jobqueue_claims_in_flight") == 2

    # A report; then the other claim's agent dies: its lease expires, waiting for the reaper.
    lifecycle.report_status(grants[0].job.id, grants[0].claim_id, states.SUCCESSFUL)
    JobClaim.objects.filter(job_id=grants[1].job.id).update(claim_expires_at=NowPlusSeconds(-5))
    waiting = scrape(client)
    assert value(waiting, "jobqueue_expired_leases_pending") == 1
    assert value(waiting, "jobqueue_reports_total", status="successful") - value(
        before, "jobqueue_reports_total", status="successful") == 1

    # The reaper runs (its last attempt: the job ends expired).
    result = reaper.sweep()
    assert result.expired == 1
    reaped = scrape(client)
    assert value(reaped, "jobqueue_expired_leases_pending") == 0
    assert value(reaped, "jobqueue_reaped_total", outcome="expired") - value(
        waiting, "jobqueue_reaped_total", outcome="expired") == 1
    assert value(reaped, "jobqueue_reaper_runs_total") - value(
        waiting, "jobqueue_reaper_runs_total") == 1
    assert value(reaped, "jobqueue_reaper_last_run_timestamp_seconds") > 0
    assert value(reaped, "jobqueue_jobs", status="expired", job_agent_id=aid) == 1

    # The dead agent wakes up: its writes are refused, by code.
    with pytest.raises(JobFinished):
        lifecycle.heartbeat(grants[1].job.id, grants[1].claim_id)
    third = lifecycle.claim_next_job(agent)
    lifecycle.requeue_job(third.job.id, actor="operator:test")
    with pytest.raises(ClaimSuperseded):
        lifecycle.release_job(third.job.id, third.claim_id)
    refused = scrape(client)

    def delta(code, operation):
        name = "jobqueue_stale_writes_refused_total"
        return value(refused, name, operation=operation, code=code) - value(
            before, name, operation=operation, code=code)

    assert delta("job_finished", "heartbeat") == 1
    assert delta("claim_superseded", "release") == 1
    assert value(refused, "jobqueue_operator_transitions_total", kind="requeued") - value(
        before, "jobqueue_operator_transitions_total", kind="requeued") == 1

    # Request latency of the scrapes themselves, by route, never by raw path.
    count = "jobqueue_http_request_duration_seconds_count"
    assert value(refused, count, method="GET", route="metrics", status=200) - value(
        before, count, method="GET", route="metrics", status=200) == 4
    text = client.get("/metrics").content.decode()
    assert "never-in-metrics" not in text
    for grant in grants:
        assert str(grant.claim_id) not in text


def test_request_latency_labels_unmatched_paths_by_pattern(client):
    before = scrape(client)
    # Not digits: a job agent's UUID in another label could hold them by chance.
    assert client.get("/no/such/page/xyzzy-nowhere").status_code == 404
    after = scrape(client)
    name = "jobqueue_http_request_duration_seconds_count"
    assert value(after, name, method="GET", route="unmatched", status=404) - value(
        before, name, method="GET", route="unmatched", status=404) == 1
    assert not any("xyzzy" in str(labels) for (_n, labels) in after)


def test_request_latency_labels_api_requests_by_their_url_pattern(client):
    """The API's router builds path() routes with converters: the label is the pattern the
    viewset action is routed by, never the ids in the request's path."""
    from tests.integration.api.conftest import make_world

    world = make_world()
    job = JobFactory(job_agent=world.agent)
    before = scrape(client)
    agent_caller = world.agent_caller()
    claim = agent_caller.post(f"job-agents/{world.agent.id}/jobs/claim").json()["claim"]
    assert agent_caller.post(
        f"jobs/{job.id}/heartbeat", json={"claim_id": claim["claim_id"]}
    ).status_code == 200
    assert agent_caller.get(f"jobs/{job.id}/heartbeat").status_code == 405
    after = scrape(client)
    name = "jobqueue_http_request_duration_seconds_count"
    base = "v1/workspaces/<anyid:workspace_id>/"
    for method, route, status in [
        ("POST", base + "job-agents/<anyid:agent_id>/jobs/claim", 200),
        ("POST", base + "jobs/<anyid:job_id>/heartbeat", 200),
        ("GET", base + "jobs/<anyid:job_id>/heartbeat", 405),
    ]:
        labels = {"method": method, "route": route, "status": status}
        assert value(after, name, **labels) - value(before, name, **labels) == 1, route
    assert not any(str(job.id) in str(labels) for (_n, labels) in after)


def test_metrics_accepts_only_get(client):
    assert client.post("/metrics").status_code == 405


@pytest.mark.django_db(transaction=True)
def test_reaped_totals_count_a_separate_reaper_process(client):
    """The reaper runs in its own process: /metrics reads what it did from reaper_run."""
    import json
    import subprocess
    import sys

    from tests.utils import ROOT, subprocess_env

    agent = JobAgentFactory(lease_seconds=60, max_attempts=3)
    for _ in range(2):
        JobFactory(job_agent=agent)
    for grant in lifecycle.claim_next_jobs(agent, 2):
        JobClaim.objects.filter(job_id=grant.job.id).update(claim_expires_at=NowPlusSeconds(-5))
    before = scrape(client)
    assert value(before, "jobqueue_expired_leases_pending") == 2
    out = subprocess.run(
        [sys.executable, "manage.py", "reap_claims", "--json"],
        cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=120, check=True,
    )
    assert json.loads(out.stdout)["requeued"] == 2
    after = scrape(client)
    assert value(after, "jobqueue_reaped_total", outcome="requeued") - value(
        before, "jobqueue_reaped_total", outcome="requeued") == 2
    assert value(after, "jobqueue_expired_leases_pending") == 0
    assert value(after, "jobqueue_jobs", status="queued", job_agent_id=agent.id) == 2


def test_webhook_deliveries_are_counted_by_status(client):
    from jobqueue.maintenance import webhooks
    from jobqueue.models import WebhookDelivery
    from tests.factories import claimed_job

    job, grant = claimed_job()
    webhooks.create_endpoint(job.workspace_id, "http://127.0.0.1:9/hook", [])
    webhooks.create_endpoint(job.workspace_id, "http://127.0.0.1:9/other", [])
    assert value(scrape(client), "jobqueue_webhook_deliveries", status="pending") == 0
    lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL)
    assert value(scrape(client), "jobqueue_webhook_deliveries", status="pending") == 2
    WebhookDelivery.objects.filter(id=WebhookDelivery.objects.first().id).update(status="failed")
    got = scrape(client)
    assert [value(got, "jobqueue_webhook_deliveries", status=s)
            for s in ("pending", "delivered", "failed")] == [1, 0, 1]


def test_a_wait_past_the_cap_is_counted(client, settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "MAX_WAITING_CLAIMS": 0}
    agent = JobAgentFactory()
    before = value(scrape(client), "jobqueue_waits_at_capacity_total")
    assert lifecycle.claim_next_waiting(agent, None, 20) == []  # answered at once
    assert value(scrape(client), "jobqueue_waits_at_capacity_total") - before == 1


def test_a_batch_report_counts_every_report_it_applied_by_status(client):
    agent = JobAgentFactory(lease_seconds=60, max_attempts=3)
    JobFactory.create_batch(4, job_agent=agent)
    grants = lifecycle.claim_next_jobs(agent, 4)
    before = scrape(client)
    seen = []

    def listener(kind, **data):
        if kind == "reported":
            seen.append((data["status"], data.get("count", 1)))

    observe.subscribe(listener)
    try:
        out = lifecycle.report_many(agent.id, [
            lifecycle.ReportItem(grants[0].job.id, grants[0].claim_id, states.SUCCESSFUL),
            lifecycle.ReportItem(grants[1].job.id, grants[1].claim_id, states.SUCCESSFUL),
            lifecycle.ReportItem(grants[2].job.id, grants[2].claim_id, states.FAILURE,
                                 retry=True),
            lifecycle.ReportItem(grants[3].job.id, grants[0].claim_id, states.SUCCESSFUL),  # stale
        ])
    finally:
        observe.unsubscribe(listener)
    assert sorted(seen) == [("retrying", 1), ("successful", 2)]  # one notification a status
    assert [r.accepted for r in out.results] == [True, True, True, False]
    after = scrape(client)

    def moved(status):
        return value(after, "jobqueue_reports_total", status=status) - value(
            before, "jobqueue_reports_total", status=status)

    assert (moved("successful"), moved("retrying"), moved("failure")) == (2, 1, 0)


def test_schedule_fires_are_counted_by_outcome_when_scraped(client):
    import datetime as dt

    from jobqueue.db import db_now
    from jobqueue.lifecycle import schedules
    from jobqueue.maintenance import schedules as service
    from jobqueue.models import Schedule

    agent = JobAgentFactory()
    before = scrape(client)
    schedule = schedules.create_schedule(workspace=agent.workspace, name="nightly",
                                         cron_expr="* * * * *", job_agent=agent, job={},
                                         catchup_window_seconds=0)
    # Maintenance was down for three fire times: the older ones are missed, then a fire
    # while the job of the latest is live is skipped.
    first = db_now().replace(second=0, microsecond=0) - dt.timedelta(minutes=3)
    Schedule.objects.filter(id=schedule.id).update(next_fire_at=first)
    counts = service.run_once()
    schedules.trigger_schedule(schedule.id, workspace_id=agent.workspace_id)
    Schedule.objects.filter(id=schedule.id).update(next_fire_at=db_now())
    counts["skipped"] += service.run_once()["skipped"]
    after = scrape(client)

    def moved(outcome):
        return value(after, "jobqueue_schedule_fires_total", outcome=outcome) - value(
            before, "jobqueue_schedule_fires_total", outcome=outcome)

    assert moved("fired") == counts["fired"] + 1  # and the trigger
    assert moved("missed") == counts["missed"] >= 2
    assert moved("skipped") == counts["skipped"] >= 1


def test_labelled_jobs_count_under_their_claimer_or_none(client):
    agent = lifecycle.create_job_agent(workspace=JobAgentFactory().workspace, name="gpu",
                                       labels=["gpu"])
    for _ in range(2):
        lifecycle.create_job(workspace=agent.workspace, labels=["gpu"])
    lifecycle.claim_next_job(agent)
    values = scrape(client)
    assert value(values, "jobqueue_jobs", status="queued", job_agent_id="") == 1
    assert value(values, "jobqueue_jobs", status="in_progress", job_agent_id=agent.id) == 1


def _keyed(agent, key, limit, *, running=0, held=0):
    """`running` jobs of the key in progress and `held` queued ones its slots keep back (the
    mark the key's triggers keep, set here as they set it)."""
    from jobqueue.models import Job

    for _ in range(running):
        JobFactory(job_agent=agent, concurrency_key=key, concurrency_limit=limit,
                   in_progress=True)
    ids = [JobFactory(job_agent=agent, concurrency_key=key, concurrency_limit=limit).id
           for _ in range(held)]
    Job.objects.filter(id__in=ids).update(concurrency_held=True)


def test_concurrency_keys_are_gauged_for_the_most_held_back_keys_only(client, settings):
    agent = JobAgentFactory()
    other = JobAgentFactory()  # another workspace: its key "a" is another key
    _keyed(agent, "a", 1, running=1, held=3)
    _keyed(agent, "b", 3, running=1)  # its limit: the largest of its jobs'
    _keyed(agent, "b", 2, running=1, held=1)
    _keyed(agent, "c", 1, running=1)
    JobFactory(job_agent=agent, concurrency_key="d", concurrency_limit=1)  # given a slot
    _keyed(other, "a", 4, running=2)
    JobFactory(job_agent=agent, concurrency_key="done", concurrency_limit=1, successful=True)
    ws, ows = str(agent.workspace_id), str(other.workspace_id)

    def gauges(values) -> dict:
        """{(workspace_id, key): (running, limit, held)}"""
        found = {}
        for (metric, pairs), n in values.items():
            if metric.startswith("jobqueue_concurrency_"):
                labels = dict(pairs)
                found.setdefault((labels["workspace_id"], labels["key"]), {})[metric] = n
        return {key: tuple(of.get(f"jobqueue_concurrency_{name}")
                           for name in ("running", "limit", "held"))
                for key, of in found.items()}

    # Default: every key with a job running or held back (at most 20), the finished one not.
    assert gauges(scrape(client)) == {(ws, "a"): (1, 1, 3), (ws, "b"): (2, 3, 1),
                                      (ws, "c"): (1, 1, 0), (ows, "a"): (2, 4, 0)}
    # Bounded: the most held back first, then the most running.
    settings.JOBQUEUE = {**settings.JOBQUEUE, "METRICS_TOP_KEYS": 3}
    assert set(gauges(scrape(client))) == {(ws, "a"), (ws, "b"), (ows, "a")}
    settings.JOBQUEUE = {**settings.JOBQUEUE, "METRICS_TOP_KEYS": 0}
    values = scrape(client)
    assert gauges(values) == {} and value(values, "jobqueue_database_up") == 1


def test_rate_limit_keys_are_gauged_for_the_most_held_back_keys_only(client, settings):
    """Per key with a limit: its count, its period, its jobs claimed in the window (a claim
    before it does not count) and its queued jobs held back (the mark the key's triggers
    keep); a key with nothing held back or claimed, a key without a limit: no series."""
    from jobqueue.lifecycle import ratelimits
    from jobqueue.models import Job

    agent = JobAgentFactory()
    other = JobAgentFactory()  # another workspace: its key "a" is another key
    ws, ows = agent.workspace_id, other.workspace_id
    ratelimits.set_limit(ws, "a", 1, 60)
    ratelimits.set_limit(ws, "b", 2, 3600)
    ratelimits.set_limit(ws, "c", 3, 600)
    ratelimits.set_limit(ws, "idle", 5, 60)
    ratelimits.set_limit(ows, "a", 4, 10)
    for key, n in (("a", 4), ("b", 4), ("c", 1)):
        for _ in range(n):
            JobFactory(job_agent=agent, rate_limit_key=key)
    JobFactory(job_agent=other, rate_limit_key="a")
    JobFactory(job_agent=agent, rate_limit_key="nolimit")
    lifecycle.claim_next(agent, limit=10)  # a: 1 claimed, 3 held; b: 2 and 2; c: 1 and 0
    lifecycle.claim_next(other, limit=10)
    early = JobFactory(job_agent=agent, rate_limit_key="idle", in_progress=True)
    Job.objects.filter(id=early.id).update(started_at=NowPlusSeconds(-61))  # out of its window
    wsid, owsid = str(ws), str(ows)

    def gauges(values) -> dict:
        """{(workspace_id, key): (count, period_seconds, claimed, held)}"""
        found = {}
        for (metric, pairs), n in values.items():
            if metric.startswith("jobqueue_rate_limit_"):
                labels = dict(pairs)
                found.setdefault((labels["workspace_id"], labels["key"]), {})[metric] = n
        return {key: tuple(of.get(f"jobqueue_rate_limit_{name}")
                           for name in ("count", "period_seconds", "claimed", "held"))
                for key, of in found.items()}

    assert gauges(scrape(client)) == {
        (wsid, "a"): (1, 60, 1, 3), (wsid, "b"): (2, 3600, 2, 2), (wsid, "c"): (3, 600, 1, 0),
        (owsid, "a"): (4, 10, 1, 0)}
    # Bounded: the most held back first, then the most claimed.
    settings.JOBQUEUE = {**settings.JOBQUEUE, "METRICS_TOP_KEYS": 2}
    assert set(gauges(scrape(client))) == {(wsid, "a"), (wsid, "b")}
    settings.JOBQUEUE = {**settings.JOBQUEUE, "METRICS_TOP_KEYS": 0}
    values = scrape(client)
    assert gauges(values) == {} and value(values, "jobqueue_database_up") == 1


def test_fairness_keys_are_gauged_for_the_most_queued_keys_only(client, settings):
    """Per fairness key with jobs queued or in progress: its weight (1 when none is set), its
    queued jobs and its jobs in progress; a key with neither (its jobs finished), a weight
    without jobs: no series."""
    from jobqueue.lifecycle import fairness

    agent = JobAgentFactory()
    other = JobAgentFactory()  # another workspace: its key "a" is another key
    ws, ows = agent.workspace_id, other.workspace_id

    def create(on, key, n=1):
        for _ in range(n):
            lifecycle.create_job(workspace=on.workspace, job_agent=on, fairness_key=key,
                                 dispatch_context={"token": "never-in-metrics"})

    def claim(n):
        grants = lifecycle.claim_next(agent, limit=n)
        assert len(grants) == n
        return grants

    create(agent, "done")
    (done,) = claim(1)
    lifecycle.report_status(done.job.id, done.claim_id, states.SUCCESSFUL)
    create(agent, "c", 2)
    claim(2)
    create(agent, "a")
    claim(1)
    fairness.set_weight(ws, "a", 4)
    fairness.set_weight(ws, "idle", 7)
    create(agent, "a", 3)
    create(agent, "b", 2)
    create(other, "a")
    wsid, owsid = str(ws), str(ows)

    def gauges(values) -> dict:
        """{(workspace_id, key): (weight, queued, running)}"""
        found = {}
        for (metric, pairs), n in values.items():
            if metric.startswith("jobqueue_fairness_"):
                labels = dict(pairs)
                found.setdefault((labels["workspace_id"], labels["key"]), {})[metric] = n
        return {key: tuple(of.get(f"jobqueue_fairness_{name}")
                           for name in ("weight", "queued", "running"))
                for key, of in found.items()}

    values = scrape(client)
    assert gauges(values) == {
        (wsid, "a"): (4, 3, 1), (wsid, "b"): (1, 2, 0), (wsid, "c"): (1, 0, 2),
        (owsid, "a"): (1, 1, 0)}
    assert not any("never-in-metrics" in str(labels) for _, labels in values)
    # Bounded: the most queued first, then the most running.
    settings.JOBQUEUE = {**settings.JOBQUEUE, "METRICS_TOP_KEYS": 2}
    assert set(gauges(scrape(client))) == {(wsid, "a"), (wsid, "b")}
    settings.JOBQUEUE = {**settings.JOBQUEUE, "METRICS_TOP_KEYS": 0}
    values = scrape(client)
    assert gauges(values) == {} and value(values, "jobqueue_database_up") == 1
