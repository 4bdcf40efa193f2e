"""Webhooks: the outbox row is written in the transaction of every transition that ends a
job, and the sender (a real local receiver over real sockets) signs, retries with backoff,
gives up, never follows redirects, reads a capped answer, keeps to the allowed networks, never
sends one try twice at once, and loses nothing when it is SIGKILLed mid-send."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest
from django.db import transaction

from jobqueue import lifecycle, states
from jobqueue.db import NowPlusSeconds
from jobqueue.exceptions import Conflict
from jobqueue.lifecycle.finished import job_document, json_time
from jobqueue.maintenance import loop, pruner, webhooks
from jobqueue.models import (
    Job,
    JobClaim,
    MaintenanceRun,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
)
from tests.factories import JobAgentFactory, JobFactory, WorkspaceFactory, claimed_job
from tests.utils import ROOT, run_threads, subprocess_env
from tests.webhook_receiver import Receiver

pytestmark = pytest.mark.django_db(transaction=True)
SECRET_CONTEXT = {"password": "hunter2-webhook-4d1f"}


# The documentation's verification snippet (docs/completion.md, "Receiving webhooks"), as is.
def verify(secret: str, header: str, body: bytes, tolerance: int = 300) -> bool:
    import hashlib
    import hmac
    import time

    parts = dict(p.split("=", 1) for p in header.split(","))
    t, sent = int(parts["t"]), parts["v1"]
    mac = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(mac, sent) and abs(time.time() - t) <= tolerance


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def fast(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "WEBHOOK_BACKOFF_SECONDS": 0.01,
                         "WEBHOOK_MAX_BACKOFF_SECONDS": 0.01, "WEBHOOK_TIMEOUT_SECONDS": 1.0}
    return settings


def endpoint(workspace, url="http://127.0.0.1:9/hook", events=()):
    ep, secret = webhooks.create_endpoint(workspace.id, url, list(events))
    return ep


def deliveries(**kw):
    return list(WebhookDelivery.objects.filter(**kw).values_list("job_id", "endpoint_id"))


def drain(limit=50, rounds=50):
    total = Counter()
    for _ in range(rounds):
        counts = webhooks.run_once(limit=limit)
        total.update(counts)
        if not any(counts.values()):
            WebhookDelivery.objects.filter(status=WebhookDelivery.PENDING).update(
                next_attempt_at=NowPlusSeconds(-1))  # the backoff, elapsed
            if not WebhookDelivery.objects.due().exists():
                break
    return total


# --- the outbox -----------------------------------------------------------------------------

def test_every_path_that_ends_a_job_writes_one_row_per_endpoint_in_its_transaction():
    agent = JobAgentFactory(max_attempts=1)
    ws = agent.workspace
    everything, finished_only = endpoint(ws), endpoint(ws, events=["job.finished"])
    endpoint(ws, events=["group.finished"])  # wants no job events
    endpoint(WorkspaceFactory())  # another workspace's
    single, g1 = claimed_job(job_agent=agent, max_attempts=1)
    lifecycle.report_status(single.id, g1.claim_id, states.IN_PROGRESS)  # progress: nothing
    assert not WebhookDelivery.objects.exists()
    lifecycle.report_status(single.id, g1.claim_id, states.SUCCESSFUL)
    lifecycle.report_status(single.id, g1.claim_id, states.SUCCESSFUL)  # a retry: nothing
    batch = [claimed_job(job_agent=agent, max_attempts=1) for _ in range(2)]
    lifecycle.report_many(agent.id, [lifecycle.ReportItem(j.id, g.claim_id, states.FAILURE)
                                     for j, g in batch])
    reaped, _ = claimed_job(job_agent=agent, max_attempts=1)
    JobClaim.objects.filter(job=reaped).update(claim_expires_at=NowPlusSeconds(-1))
    lifecycle.reap_expired_claims_once(10)
    cancelled, failed = JobFactory(job_agent=agent), JobFactory(job_agent=agent)
    lifecycle.cancel_job(cancelled.id)
    lifecycle.cancel_job(cancelled.id)  # already cancelled: nothing
    lifecycle.mark_failed(failed.id)
    lifecycle.requeue_job(failed.id)  # not an end: nothing
    ended = [single.id, batch[0][0].id, batch[1][0].id, reaped.id, cancelled.id, failed.id]
    assert sorted(deliveries()) == sorted(
        (job_id, ep.id) for job_id in ended for ep in (everything, finished_only))
    row = WebhookDelivery.objects.filter(job_id=single.id).first()
    assert (row.status, row.attempts, row.event) == ("pending", 0, "job.finished")
    # Every body is fixed in the transition's transaction: the job as it ended (the same
    # document on both databases, whether the report statement or the ORM wrote it).
    for row in WebhookDelivery.objects.select_related("endpoint"):
        if row.job_id != failed.id:
            assert row.payload == {"job": job_document(Job.objects.get(id=row.job_id))}
        body = json.loads(webhooks.body_of(row, []))
        assert body == {"id": str(row.id), "event": "job.finished",
                        "created_at": json_time(row.created_at), "job": row.payload["job"]}
    # ... and a later requeue changes nothing of it.
    assert {r.payload["job"]["status"] for r in WebhookDelivery.objects.filter(job=failed)} == {
        "failure"}
    assert Job.objects.get(id=failed.id).status == states.QUEUED


def test_a_transition_that_rolls_back_leaves_no_outbox_row():
    job, grant = claimed_job()
    endpoint(job.workspace)

    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():
        lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL)
        assert WebhookDelivery.objects.count() == 1  # written with the transition
        raise Abort
    assert not WebhookDelivery.objects.exists()
    assert Job.objects.get(id=job.id).status == states.IN_PROGRESS


def test_racing_reports_write_one_row():
    agent = JobAgentFactory()
    endpoint(agent.workspace)
    jobs = [claimed_job(job_agent=agent) for _ in range(8)]

    def racer(i, barrier):
        for job, grant in jobs:
            barrier.wait()
            try:
                if i % 2:
                    lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL)
                else:
                    lifecycle.cancel_job(job.id)
            except Conflict:
                pass

    run_threads(racer, 4)
    assert Counter(job_id for job_id, _ in deliveries()) == {j.id: 1 for j, _ in jobs}


# --- the sender -----------------------------------------------------------------------------

def test_a_delivery_is_signed_and_carries_the_job_without_dispatch_context(receiver):
    job, grant = claimed_job(dispatch_context=SECRET_CONTEXT)
    ep, secret = webhooks.create_endpoint(job.workspace_id, receiver.url)
    lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL, result={"rows": 3})
    assert webhooks.run_once() == {"delivered": 1, "retrying": 0, "failed": 0, "stale": 0,
                                   "deferred": 0}
    (req,) = receiver.requests
    h, body = req["headers"], req["body"]
    delivery = WebhookDelivery.objects.get()
    assert h["X-Jobqueue-Event"] == "job.finished"
    assert h["X-Jobqueue-Delivery"] == str(delivery.id)
    assert h["Content-Type"] == "application/json"
    assert verify(secret, h["X-Jobqueue-Signature"], body)
    assert not verify(secret, h["X-Jobqueue-Signature"], body + b" ")
    assert not verify("whsec_other", h["X-Jobqueue-Signature"], body)
    doc = json.loads(body)
    assert set(doc) == {"id", "event", "created_at", "job"} and doc["id"] == str(delivery.id)
    assert doc["job"]["id"] == str(job.id) and doc["job"]["status"] == "successful"
    assert doc["job"]["result"] == {"rows": 3} and "dispatch_context" not in doc["job"]
    assert SECRET_CONTEXT["password"].encode() not in body
    assert (delivery.status, delivery.attempts, delivery.last_status_code) == ("delivered", 1,
                                                                              200)
    (attempt,) = WebhookAttempt.objects.all()
    assert attempt.status_code == 200 and attempt.duration_seconds >= 0 and not attempt.error
    assert webhooks.run_once()["delivered"] == 0  # sent once


def test_a_receiver_answering_500_is_retried_with_backoff_then_given_up(receiver, settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "WEBHOOK_MAX_ATTEMPTS": 3,
                         "WEBHOOK_BACKOFF_SECONDS": 100, "WEBHOOK_MAX_BACKOFF_SECONDS": 1000}
    receiver.default = 500
    job, grant = claimed_job()
    endpoint(job.workspace, receiver.url)
    lifecycle.report_status(job.id, grant.claim_id, states.FAILURE)
    gaps = []
    for expected in ("retrying", "retrying", "failed"):
        counts = webhooks.run_once()
        assert counts[expected] == 1, counts
        d = WebhookDelivery.objects.get()
        gaps.append((d.next_attempt_at - d.last_attempt_at).total_seconds())
        assert webhooks.run_once()["retrying"] == 0  # not due before its backoff
        WebhookDelivery.objects.update(next_attempt_at=NowPlusSeconds(-1))
    assert 80 <= gaps[0] <= 120 and 160 <= gaps[1] <= 240  # 100 s, then 200 s, +-20%
    d = WebhookDelivery.objects.get()
    assert (d.status, d.attempts, d.last_status_code, d.last_error) == (
        "failed", 3, 500, "answered 500")
    assert list(WebhookAttempt.objects.values_list("number", "status_code")) == [
        (1, 500), (2, 500), (3, 500)]
    bodies = {r["body"] for r in receiver.requests}
    assert len(receiver.requests) == 3 and len(bodies) == 1  # every try the same bytes
    receiver.default = 204
    assert webhooks.redeliver([d.id]) == 1
    assert webhooks.run_once()["delivered"] == 1
    assert WebhookDelivery.objects.get().status == "delivered"


def test_a_timeout_is_a_failed_try(receiver, fast):
    fast.JOBQUEUE = {**fast.JOBQUEUE, "WEBHOOK_TIMEOUT_SECONDS": 0.3}
    receiver.script = [("hang", 2)]
    job, grant = claimed_job()
    endpoint(job.workspace, receiver.url)
    lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL)
    started = time.monotonic()
    assert webhooks.run_once()["retrying"] == 1
    assert time.monotonic() - started < 1.5
    assert WebhookDelivery.objects.get().last_error == "timeout"
    assert WebhookAttempt.objects.get().status_code is None
    assert drain()["delivered"] == 1


def test_redirects_are_not_followed_and_answers_are_read_up_to_the_cap(receiver, fast):
    receiver.script = [("redirect",), ("big", 64 * 1024 * 1024)]
    job, grant = claimed_job()
    endpoint(job.workspace, receiver.url)
    lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL)
    assert webhooks.run_once()["retrying"] == 1
    d = WebhookDelivery.objects.get()
    assert (d.last_status_code, d.last_error) == (302, "redirect not followed")
    assert [r["path"] for r in receiver.requests] == ["/hook"]  # never /hook/elsewhere
    WebhookDelivery.objects.update(next_attempt_at=NowPlusSeconds(-1))
    started = time.monotonic()
    assert webhooks.run_once()["delivered"] == 1
    assert time.monotonic() - started < 10
    receiver.wait_answered(2)  # the big answer has ended: the receiver stopped writing
    assert receiver.hung_up == 1  # because the sender hung up on it,
    assert receiver.bytes_written < 32 * 1024 * 1024  # having stopped reading early


def test_targets_outside_the_allowed_networks_and_other_schemes_are_never_called(
        receiver, fast):
    fast.JOBQUEUE = {**fast.JOBQUEUE, "WEBHOOK_ALLOWED_NETWORKS": "10.0.0.0/8, 192.168.0.0/16"}
    job, grant = claimed_job()
    endpoint(job.workspace, receiver.url)
    ftp = endpoint(job.workspace, "ftp://127.0.0.1/x")
    lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL)
    assert webhooks.run_once()["retrying"] == 2
    errors = dict(WebhookDelivery.objects.values_list("endpoint_id", "last_error"))
    assert errors.pop(ftp.id) == "refused: only http(s) URLs are called"
    assert all("outside JOBQUEUE_WEBHOOK_ALLOWED_NETWORKS" in e for e in errors.values())
    assert receiver.requests == []
    fast.JOBQUEUE = {**fast.JOBQUEUE, "WEBHOOK_ALLOWED_NETWORKS": "127.0.0.0/8"}
    WebhookDelivery.objects.update(next_attempt_at=NowPlusSeconds(-1))
    assert webhooks.run_once()["delivered"] == 1 and len(receiver.requests) == 1


def test_bad_allowed_networks_and_unresolvable_hosts(fast):
    from django.core.exceptions import ImproperlyConfigured

    fast.JOBQUEUE = {**fast.JOBQUEUE, "WEBHOOK_ALLOWED_NETWORKS": "not-a-network"}
    with pytest.raises(ImproperlyConfigured):
        webhooks.check_target("http://127.0.0.1/")
    fast.JOBQUEUE = {**fast.JOBQUEUE, "WEBHOOK_ALLOWED_NETWORKS": "127.0.0.0/8"}
    with pytest.raises(webhooks.TargetRefused, match="cannot resolve"):
        webhooks.check_target("http://no-such-host.invalid/")
    webhooks.check_target("http://localhost:1/")  # resolves inside


def test_a_connection_refused_is_a_failed_try(fast):
    job, grant = claimed_job()
    endpoint(job.workspace, "http://127.0.0.1:9/hook")  # discard port: nobody listens
    lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL)
    assert webhooks.run_once()["retrying"] == 1
    assert WebhookDelivery.objects.get().last_error.startswith("ConnectError")


def test_a_try_whose_reservation_ran_out_cannot_overwrite_the_next_one(receiver):
    job, grant = claimed_job()
    endpoint(job.workspace, receiver.url)
    lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL)
    (first,) = webhooks.take(10)
    assert webhooks.take(10) == []  # reserved
    WebhookDelivery.objects.update(next_attempt_at=NowPlusSeconds(-1))  # the sender froze
    (second,) = webhooks.take(10)
    assert (first.attempts, second.attempts) == (1, 2)
    assert webhooks.finish(first, 200, "", 0.1) == "stale"
    assert webhooks.finish(second, 200, "", 0.1) == "delivered"
    assert WebhookAttempt.objects.count() == 2  # both tries are in the log


def test_concurrent_senders_send_each_delivery_once(receiver):
    agent = JobAgentFactory()
    endpoint(agent.workspace, receiver.url)
    endpoint(agent.workspace, receiver.url)
    jobs = [claimed_job(job_agent=agent) for _ in range(30)]
    lifecycle.report_many(agent.id, [lifecycle.ReportItem(j.id, g.claim_id, states.SUCCESSFUL)
                                     for j, g in jobs])
    assert WebhookDelivery.objects.count() == 60

    def sender(i, barrier):
        barrier.wait()
        sent = 0
        while True:
            n = webhooks.run_once(limit=4)["delivered"]
            if n == 0 and not WebhookDelivery.objects.due().exists():
                return sent
            sent += n

    sent = run_threads(sender, 4)
    assert sum(sent) == 60 and sum(1 for n in sent if n) > 1
    ids = Counter(r["headers"]["X-Jobqueue-Delivery"] for r in receiver.requests)
    assert len(ids) == 60 and set(ids.values()) == {1}
    assert set(WebhookDelivery.objects.values_list("status", flat=True)) == {"delivered"}


def test_the_sender_is_a_maintenance_service_and_pruning_takes_deliveries_along(receiver):
    job, grant = claimed_job()
    endpoint(job.workspace, receiver.url)
    lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL)
    outcomes = {o.service: o for o in loop.run_once()}
    assert outcomes["webhooks"].counts["delivered"] == 1
    assert MaintenanceRun.objects.get(service="webhooks").counts["delivered"] == 1
    Job.objects.filter(id=job.id).update(completed_at=NowPlusSeconds(-30 * 86400))
    assert pruner.run_once().jobs == 1
    assert not WebhookDelivery.objects.exists() and not WebhookAttempt.objects.exists()
    assert WebhookEndpoint.objects.count() == 1


def test_a_sender_killed_mid_send_loses_nothing_and_the_delivery_is_sent_again(receiver):
    release = threading.Event()
    receiver.script = [("wait", release)]
    job, grant = claimed_job()
    ep, secret = webhooks.create_endpoint(job.workspace_id, receiver.url)
    lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL)
    env = subprocess_env(JOBQUEUE_WEBHOOK_LEASE_SECONDS="2",
                         JOBQUEUE_WEBHOOK_INTERVAL_SECONDS="0.1")

    def start():
        proc = subprocess.Popen([sys.executable, "manage.py", "run_maintenance", "--loop"],
                                cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        assert "maintenance looping" in proc.stderr.readline()
        return proc

    first = start()
    try:
        receiver.wait_for(1)  # the POST is in flight: the receiver holds it
        os.kill(first.pid, signal.SIGKILL)
        first.wait(30)
    finally:
        release.set()
    d = WebhookDelivery.objects.get()
    assert (d.status, d.attempts) == ("pending", 1) and not WebhookAttempt.objects.exists()
    second = start()
    try:
        receiver.wait_for(2)
        deadline = time.monotonic() + 30
        while WebhookDelivery.objects.get().status != "delivered":
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        second.send_signal(signal.SIGTERM)
        _out, err = second.communicate(timeout=30)
    assert second.returncode == 0, err
    a, b = receiver.requests[:2]
    assert a["headers"]["X-Jobqueue-Delivery"] == b["headers"]["X-Jobqueue-Delivery"]
    assert a["body"] == b["body"] and verify(secret, b["headers"]["X-Jobqueue-Signature"],
                                             b["body"])
    assert WebhookDelivery.objects.get().attempts == 2


def test_no_log_line_carries_the_url_or_the_secret(receiver, fast, caplog):
    import logging

    receiver.script = [500]
    job, grant = claimed_job()
    url = receiver.url + "?token=hunter2-in-the-url"
    ep, secret = webhooks.create_endpoint(job.workspace_id, url)
    lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL)
    assert logging.getLogger("httpx").level == logging.WARNING  # config/settings.py LOGGING
    with caplog.at_level(logging.DEBUG):
        assert drain()["delivered"] == 1
    assert "try 1: answered 500" in caplog.text  # the sender's own line
    assert "hunter2-in-the-url" not in caplog.text and secret not in caplog.text
