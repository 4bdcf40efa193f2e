"""Prometheus metrics: counters fed by jobqueue.observe, a request latency histogram (fed by
ops.middleware), and a collector that reads the database at scrape time.

Two kinds of numbers, on purpose:

- Counters of what *this service's processes* did (claims, heartbeats, reports, releases,
  stale writes refused, request latency) come from jobqueue.observe and ops.middleware.
  Under gunicorn every worker is its own process with its own counters; with
  PROMETHEUS_MULTIPROC_DIR set (`make run` sets it), prometheus-client writes them to files
  in that directory and /metrics adds up every worker's, whichever worker answers the scrape.
  Without it (one process: tests, `runserver`), a plain in-process registry is used.
- Numbers about the *queue* (jobs by status and agent, expired leases waiting for the
  reaper, what the reaper did) are read from the database when /metrics is scraped, so they
  are right whatever process did the work: the reaper is a separate process, and it and the
  admin's "reap now" record every sweep in `reaper_run`.

Labels never carry dispatch_context, results or tokens; agents and workspaces appear by id.
A concurrency key, a rate limit key or a fairness key appears as itself (the producer's name of
the key), only for the few keys with the most jobs held back (a fairness key: the most jobs
queued; JOBQUEUE_METRICS_TOP_KEYS of each kind): the number of series is bounded.
"""

from __future__ import annotations

import logging
import os

from django.db import DatabaseError
from django.db.models import Count, Max, Sum
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

# The logger keeps the name it had when this module lived in the core (log routing).
log = logging.getLogger("jobqueue.metrics")

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

# No `*_created` series: they double the output and nobody here graphs them.
disable_created_metrics()

if os.environ.get(MULTIPROC_ENV):
    # Each process writes its files there from the first metric on: make sure it exists.
    os.makedirs(os.environ[MULTIPROC_ENV], exist_ok=True)

# In plain mode the metrics live in this registry. In multiprocess mode the same objects
# write their values to files (prometheus-client decides at import, from the environment)
# and each scrape builds a registry that reads every process's files.
PROCESS_REGISTRY = CollectorRegistry(auto_describe=True)


def _counter(name: str, documentation: str, labels=()) -> Counter:
    return Counter(name, documentation, labels, registry=PROCESS_REGISTRY)


CLAIMS = _counter("jobqueue_claims", "Jobs handed out by a claim.", ["job_agent_id"])
HEARTBEATS = _counter("jobqueue_heartbeats", "Leases extended by a heartbeat.", ["job_agent_id"])
REPORTS = _counter(
    "jobqueue_reports", "Status reports accepted (progress and terminal), by status.",
    ["status"],
)
RELEASES = _counter("jobqueue_releases", "Jobs given back by their agent.", ["job_agent_id"])
STALE_WRITES_REFUSED = _counter(
    "jobqueue_stale_writes_refused",
    "Writes with a claim_id that was no longer current, refused (409), by operation and code.",
    ["operation", "code"],
)
JOBS_CREATED = _counter("jobqueue_jobs_created", "Jobs created.")
OPERATOR_TRANSITIONS = _counter(
    "jobqueue_operator_transitions",
    "Operator transitions (API and admin): cancels, requeues, agent pauses and resumes.",
    ["kind"],
)
THROTTLE_CACHE_FAILURES = _counter(
    "jobqueue_throttle_cache_failures",
    "Throttle cache calls that failed (e.g. Redis down): those requests were not throttled.",
)
WAITS_AT_CAPACITY = _counter(
    "jobqueue_waits_at_capacity",
    "Long-poll waits a process could not hold (it held JOBQUEUE_MAX_WAITING_CLAIMS or as many "
    "as its threads allow): those claims answered at once.",
)
REQUEST_LATENCY = Histogram(
    "jobqueue_http_request_duration_seconds",
    "Time to answer an HTTP request, by method, URL route and status code.",
    ["method", "route", "status"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    registry=PROCESS_REGISTRY,
)


def _agent_label(value) -> str:
    return "" if value is None else str(value)


def on_event(kind: str, **data) -> None:
    """jobqueue.observe listener (subscribed in OpsConfig.ready())."""
    if kind == "claimed":
        CLAIMS.labels(_agent_label(data.get("job_agent_id"))).inc(data.get("count", 1))
    elif kind == "heartbeat":
        HEARTBEATS.labels(_agent_label(data.get("job_agent_id"))).inc(data.get("count", 1))
    elif kind == "progress":
        REPORTS.labels("in_progress").inc()
    elif kind == "reported":
        REPORTS.labels(str(data.get("status", ""))).inc(data.get("count", 1))
    elif kind == "released":
        RELEASES.labels(_agent_label(data.get("job_agent_id"))).inc()
    elif kind == "refused":
        STALE_WRITES_REFUSED.labels(str(data.get("operation", "")), str(data.get("code", ""))).inc()
    elif kind == "created":
        JOBS_CREATED.inc()
    elif kind == "throttle_cache_failed":
        THROTTLE_CACHE_FAILURES.inc()
    elif kind == "wait_at_capacity":
        WAITS_AT_CAPACITY.inc()
    elif kind in ("cancelled", "requeued", "agent_paused", "agent_resumed"):
        OPERATOR_TRANSITIONS.labels(kind).inc()
    # "reaped" is counted from reaper_run at scrape time: the reaper is another process.


class DatabaseCollector:
    """Reads the queue's state from the database at scrape time."""

    def describe(self):
        return []

    def collect(self):
        from jobqueue.conf import jobqueue_settings
        from jobqueue.keystats import busiest_fairness_keys, busiest_keys, busiest_rate_keys
        from jobqueue.models import (
            Job,
            JobAgent,
            JobClaim,
            ReaperRun,
            Schedule,
            WebhookDelivery,
        )

        up = GaugeMetricFamily("jobqueue_database_up", "1 when the scrape could read the database.")
        try:
            jobs = GaugeMetricFamily(
                "jobqueue_jobs", "Jobs by status and job agent (the one that claimed a "
                "labelled job last; empty before its first claim).",
                labels=["status", "job_agent_id"]
            )
            rows = Job.objects.order_by().values_list("status", "job_agent_id").annotate(
                n=Count("id")
            )
            seen = set()
            for status, agent_id, n in rows:
                # "" for labelled jobs no agent has claimed yet
                jobs.add_metric([status, "" if agent_id is None else str(agent_id)], n)
                seen.add(status)
            paused = list(
                JobAgent.objects.filter(paused_at__isnull=False).values_list("id", flat=True)
            )
            deliveries = dict(WebhookDelivery.objects.order_by().values_list("status")
                              .annotate(n=Count("id")))
            pending = JobClaim.objects.expired().count()
            in_flight = JobClaim.objects.count()
            runs = ReaperRun.objects.filter(dry_run=False).aggregate(
                runs=Sum("sweeps"),
                requeued=Sum("requeued"),
                expired=Sum("expired"),
                last=Max("finished_at"),
            )
            fires = Schedule.objects.aggregate(
                fired=Sum("fired"), skipped=Sum("skipped"), missed=Sum("missed"))
            top_keys = int(jobqueue_settings()["METRICS_TOP_KEYS"])
            keys = busiest_keys(top_keys)
            rate_keys = busiest_rate_keys(top_keys)
            fair_keys = busiest_fairness_keys(top_keys)
        except DatabaseError as exc:
            log.warning("metrics: database unavailable (%s)", type(exc).__name__)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield jobs
        yield GaugeMetricFamily(
            "jobqueue_expired_leases_pending",
            "In-progress jobs whose lease has expired and that the reaper has not taken yet.",
            value=pending,
        )
        yield GaugeMetricFamily(
            "jobqueue_claims_in_flight", "Live claims (rows of job_claim).", value=in_flight
        )
        paused_gauge = GaugeMetricFamily(
            "jobqueue_job_agent_paused",
            "1 for each paused job agent (its claims hand out nothing); absent when running.",
            labels=["job_agent_id"],
        )
        for agent_id in paused:
            paused_gauge.add_metric([str(agent_id)], 1)
        yield paused_gauge
        hooks = GaugeMetricFamily(
            "jobqueue_webhook_deliveries",
            "Webhook deliveries kept, by status: pending (to send or retry), delivered, failed "
            "(given up after JOBQUEUE_WEBHOOK_MAX_ATTEMPTS tries).",
            labels=["status"],
        )
        for status in ("pending", "delivered", "failed"):
            hooks.add_metric([status], deliveries.get(status, 0))
        yield hooks
        reaped = CounterMetricFamily(
            "jobqueue_reaped",
            "Expired leases reaped, by outcome: requeued, or expired on the last attempt "
            "(from reaper_run; every reaper process and the admin's reap-now).",
            labels=["outcome"],
        )
        reaped.add_metric(["requeued"], runs["requeued"] or 0)
        reaped.add_metric(["expired"], runs["expired"] or 0)
        yield reaped
        yield CounterMetricFamily(
            "jobqueue_reaper_runs", "Reaper sweeps recorded (dry runs excluded).",
            value=runs["runs"],
        )
        schedule_fires = CounterMetricFamily(
            "jobqueue_schedule_fires",
            "Schedules' fire times by outcome: fired (a job made), skipped (the overlap "
            "policy, or the job refused), missed (past the catch-up window); triggers count "
            "too (from the schedule table: a deleted schedule's fires leave the sum).",
            labels=["outcome"],
        )
        for outcome in ("fired", "skipped", "missed"):
            schedule_fires.add_metric([outcome], fires[outcome] or 0)
        yield schedule_fires
        yield from concurrency_families(keys)
        yield from rate_limit_families(rate_keys)
        yield from fairness_families(fair_keys)
        last = runs["last"]
        yield GaugeMetricFamily(
            "jobqueue_reaper_last_run_timestamp_seconds",
            "When the last reaper sweep finished (Unix time; 0 when it never ran).",
            value=last.timestamp() if last else 0,
        )


def concurrency_families(keys) -> list[GaugeMetricFamily]:
    """Per concurrency key, for the keys jobqueue.keystats.busiest_keys read (at most
    JOBQUEUE_METRICS_TOP_KEYS of them, the most held back first: bounded label cardinality)."""
    labels = ["workspace_id", "key"]
    running = GaugeMetricFamily(
        "jobqueue_concurrency_running",
        "Jobs of a concurrency key in progress (the keys with the most jobs held back only, "
        "JOBQUEUE_METRICS_TOP_KEYS).", labels=labels)
    limit = GaugeMetricFamily(
        "jobqueue_concurrency_limit",
        "A concurrency key's limit: the largest concurrency_limit among its live jobs (the "
        "keys with the most jobs held back only).", labels=labels)
    held = GaugeMetricFamily(
        "jobqueue_concurrency_held",
        "Queued jobs a concurrency key holds back: its slots are taken (the keys with the most "
        "jobs held back only, JOBQUEUE_METRICS_TOP_KEYS).", labels=labels)
    for key in keys:
        values = [str(key.workspace_id), key.key]
        running.add_metric(values, key.running)
        limit.add_metric(values, key.limit)
        held.add_metric(values, key.held)
    return [running, limit, held]


def rate_limit_families(keys) -> list[GaugeMetricFamily]:
    """Per rate limit key, for the keys jobqueue.keystats.busiest_rate_keys read (at most
    JOBQUEUE_METRICS_TOP_KEYS of them, the most held back first: bounded label cardinality)."""
    labels = ["workspace_id", "key"]
    count = GaugeMetricFamily(
        "jobqueue_rate_limit_count",
        "A rate limit key's limit: claims in any period_seconds (the keys with the most jobs "
        "held back only, JOBQUEUE_METRICS_TOP_KEYS).", labels=labels)
    period = GaugeMetricFamily(
        "jobqueue_rate_limit_period_seconds",
        "A rate limit key's window, in seconds (the keys with the most jobs held back only).",
        labels=labels)
    claimed = GaugeMetricFamily(
        "jobqueue_rate_limit_claimed",
        "Jobs of a rate limit key claimed in its window, by their latest claim (the keys with "
        "the most jobs held back only, JOBQUEUE_METRICS_TOP_KEYS).", labels=labels)
    held = GaugeMetricFamily(
        "jobqueue_rate_limit_held",
        "Queued jobs a rate limit key holds back: its window is full (the keys with the most "
        "jobs held back only, JOBQUEUE_METRICS_TOP_KEYS).", labels=labels)
    for key in keys:
        values = [str(key.workspace_id), key.key]
        count.add_metric(values, key.count)
        period.add_metric(values, key.period_seconds)
        claimed.add_metric(values, key.claimed)
        held.add_metric(values, key.held)
    return [count, period, claimed, held]


def fairness_families(keys) -> list[GaugeMetricFamily]:
    """Per fairness key, for the keys jobqueue.keystats.busiest_fairness_keys read (at most
    JOBQUEUE_METRICS_TOP_KEYS of them, the most queued first: bounded label cardinality)."""
    labels = ["workspace_id", "key"]
    weight = GaugeMetricFamily(
        "jobqueue_fairness_weight",
        "A fairness key's weight, 1 to 100 (1 when none is set): its claims are shared among "
        "the keys in proportion to it (the keys with the most jobs queued only, "
        "JOBQUEUE_METRICS_TOP_KEYS).", labels=labels)
    queued = GaugeMetricFamily(
        "jobqueue_fairness_queued",
        "Queued jobs of a fairness key (the keys with the most jobs queued only, "
        "JOBQUEUE_METRICS_TOP_KEYS).", labels=labels)
    running = GaugeMetricFamily(
        "jobqueue_fairness_running",
        "Jobs of a fairness key in progress (the keys with the most jobs queued only, "
        "JOBQUEUE_METRICS_TOP_KEYS).", labels=labels)
    for key in keys:
        values = [str(key.workspace_id), key.key]
        weight.add_metric(values, key.weight)
        queued.add_metric(values, key.queued)
        running.add_metric(values, key.running)
    return [weight, queued, running]


PROCESS_REGISTRY.register(DatabaseCollector())


def multiprocess_dir() -> str | None:
    return os.environ.get(MULTIPROC_ENV) or None


def render() -> tuple[bytes, str]:
    """The Prometheus text exposition of every metric, and its content type."""
    if multiprocess_dir():
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        registry.register(DatabaseCollector())
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(PROCESS_REGISTRY), CONTENT_TYPE_LATEST
