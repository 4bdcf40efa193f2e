"""The webhook sender under hostile receivers (issue 32): a try has one deadline for the whole
request; the maintenance loop runs the sender on its own thread, so a slow receiver never
delays the reaper, and a stop cuts the tries in flight; a batch is shared fairly between
workspaces and endpoints; each try is signed just before its POST; a body is fixed in the
transition's transaction; agent text echoing a dispatch_context secret is redacted."""

import json
import threading
from collections import Counter

import pytest
from django.db import connection

from jobqueue import lifecycle, states
from jobqueue.db import NowPlusSeconds
from jobqueue.exceptions import WebhookLimitReached
from jobqueue.maintenance import loop, webhooks
from jobqueue.maintenance import reaper as reaper_service
from jobqueue.models import Job, JobClaim, WebhookAttempt, WebhookDelivery, WebhookEndpoint
from tests.factories import JobAgentFactory, JobFactory, claimed_job
from tests.utils import run_threads, wait_for
from tests.webhook_receiver import Receiver

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def conf(settings, **values):
    settings.JOBQUEUE = {**settings.JOBQUEUE, **values}


def finished_job(agent=None, status=states.SUCCESSFUL, **kw):
    job, grant = claimed_job(**({"job_agent": agent} if agent else {}), **kw)
    lifecycle.report_status(job.id, grant.claim_id, status)
    return job


def send_dripped(settings, receiver, timeout, seconds_a_byte, body_bytes) -> dict:
    """One delivery to a receiver that drips its whole answer; run_once's counts."""
    conf(settings, WEBHOOK_TIMEOUT_SECONDS=timeout)
    receiver.script = [("drip", seconds_a_byte, body_bytes)]
    agent = JobAgentFactory()
    webhooks.create_endpoint(agent.workspace_id, receiver.url)
    finished_job(agent)
    return webhooks.run_once()


# --- one deadline per try -------------------------------------------------------------------

def test_a_receiver_dripping_its_answer_fails_the_try_at_the_deadline(receiver, settings):
    # One byte every 0.05 s never trips a per-read timeout of 0.5 s; the whole answer would
    # take 5 s: the try's deadline (0.5 s, connect to last byte) ends it first.
    assert send_dripped(settings, receiver, 0.5, 0.05, 60)["retrying"] == 1
    d = WebhookDelivery.objects.get()
    assert (d.last_error, d.last_status_code) == ("timeout", None)
    (attempt,) = WebhookAttempt.objects.all()
    assert attempt.error == "timeout" and attempt.status_code is None
    assert receiver.bytes_written < 100  # cut long before the 100-odd bytes were dripped


def test_a_dripped_answer_within_the_deadline_is_delivered(receiver, settings):
    assert send_dripped(settings, receiver, 30, 0.001, 5)["delivered"] == 1


# --- the sender's own thread; stopping it ---------------------------------------------------

def test_a_slow_receiver_never_delays_reaping_an_expired_lease(receiver, settings):
    """The loop's sender holds a POST (the receiver does not answer) while another job's
    lease expires: the reaper, on the loop's other thread, reaps it all the same."""
    conf(settings, WEBHOOK_TIMEOUT_SECONDS=120, WEBHOOK_INTERVAL_SECONDS=0.05,
         REAPER_INTERVAL_SECONDS=0.05)
    held = threading.Event()
    receiver.script = [("wait", held)]
    agent = JobAgentFactory()
    webhooks.create_endpoint(agent.workspace_id, receiver.url)
    finished_job(agent)
    stranded, _ = claimed_job(job_agent=agent)
    stop = threading.Event()
    outcomes = []
    runner = threading.Thread(target=loop.run_forever, kwargs={
        "stop": stop, "on_outcome": outcomes.append,
        "services": (reaper_service, webhooks)})
    runner.start()
    try:
        receiver.wait_for(1)  # the sender's POST is in flight, and stays there
        JobClaim.objects.filter(job=stranded).update(claim_expires_at=NowPlusSeconds(-1))
        wait_for(lambda: Job.objects.get(id=stranded.id).status == states.QUEUED, 60,
                 "the reaper to requeue the expired lease")
        assert not held.is_set() and len(receiver.requests) == 1  # still held
        assert WebhookDelivery.objects.get().status == "pending"
    finally:
        stop.set()
        runner.join(60)
        held.set()
    assert not runner.is_alive()
    # The stop cut the try in flight and put it back, not counted: it is sent again later.
    d = WebhookDelivery.objects.get()
    assert (d.status, d.attempts) == ("pending", 0) and not WebhookAttempt.objects.exists()
    assert any(o.service == "reaper" and o.counts.get("requeued") for o in outcomes)


def test_a_stop_ends_a_batch_at_once_and_puts_back_what_it_did_not_finish(receiver, settings):
    conf(settings, WEBHOOK_TIMEOUT_SECONDS=120, WEBHOOK_CONCURRENCY=1)
    held = threading.Event()
    receiver.script = [("wait", held)]
    agent = JobAgentFactory()
    webhooks.create_endpoint(agent.workspace_id, receiver.url)
    for _ in range(3):
        finished_job(agent)
    stop = threading.Event()
    result = {}
    def send():
        try:
            result.update(webhooks.run_once(stop=stop))
        finally:
            connection.close()

    sender = threading.Thread(target=send)
    sender.start()
    try:
        receiver.wait_for(1)
        stop.set()
        sender.join(60)
        assert not sender.is_alive() and not held.is_set()
    finally:
        held.set()
    assert result["deferred"] == 3 and result["delivered"] == 0
    assert set(WebhookDelivery.objects.values_list("status", "attempts")) == {("pending", 0)}
    assert WebhookDelivery.objects.due().count() == 3


# --- fairness -------------------------------------------------------------------------------

def test_one_endpoints_backlog_does_not_hold_back_another_endpoints_deliveries(receiver):
    agent = JobAgentFactory()
    busy = webhooks.create_endpoint(agent.workspace_id, receiver.url + "?busy")[0]
    for _ in range(30):
        finished_job(agent)
    WebhookDelivery.objects.update(next_attempt_at=NowPlusSeconds(-60))  # a backlog
    other = webhooks.create_endpoint(agent.workspace_id, receiver.url + "?other")[0]
    late = finished_job(agent)  # one delivery for each endpoint, the newest of all
    taken = webhooks.take(6)
    # Dealt round-robin between the endpoints, the longest-waiting first: the newcomer's
    # only delivery is in the batch, second, however long the other's backlog.
    assert [d.endpoint_id for d in taken] == [busy.id, other.id] + [busy.id] * 4
    assert taken[1].job_id == late.id


def test_a_workspace_with_many_endpoints_gets_no_more_of_a_batch_than_one_with_one(receiver):
    crowded, quiet = JobAgentFactory(), JobAgentFactory()
    for n in range(5):
        webhooks.create_endpoint(crowded.workspace_id, f"{receiver.url}?crowded={n}")
    webhooks.create_endpoint(quiet.workspace_id, receiver.url + "?quiet")
    for _ in range(10):
        finished_job(crowded)
        finished_job(quiet)
    assert WebhookDelivery.objects.count() == 60
    taken = webhooks.take(10)
    by_workspace = Counter(d.endpoint.workspace_id for d in taken)
    assert by_workspace == {crowded.workspace_id: 5, quiet.workspace_id: 5}
    assert len({d.endpoint_id for d in taken if d.endpoint.workspace_id ==
                crowded.workspace_id}) == 5  # shared among the crowded one's endpoints


def test_a_failed_try_rests_its_endpoints_other_deliveries_and_spares_the_others(
        receiver, settings):
    conf(settings, WEBHOOK_BACKOFF_SECONDS=100, WEBHOOK_MAX_BACKOFF_SECONDS=100)
    broken = Receiver()
    broken.default = 503
    try:
        agent = JobAgentFactory()
        webhooks.create_endpoint(agent.workspace_id, broken.url)
        webhooks.create_endpoint(agent.workspace_id, receiver.url)
        for _ in range(4):
            finished_job(agent)
        counts = webhooks.run_once()
        assert counts == {"delivered": 4, "retrying": 1, "failed": 0, "stale": 0,
                          "deferred": 3}
        assert len(broken.requests) == 1 and len(receiver.requests) == 4
        rested = WebhookDelivery.objects.filter(attempts=0, status="pending")
        assert rested.count() == 3 and not rested.filter(next_attempt_at__lte=NowPlusSeconds(
            50)).exists()  # the first retry's delay (100 s, +-20 %)
    finally:
        broken.close()


# --- signatures -----------------------------------------------------------------------------

def test_each_try_is_signed_just_before_its_post(receiver, settings):
    # Two deliveries to one endpoint go one after the other; the first answer takes over a
    # second, so the second POST is signed at least a second later than the first.
    conf(settings, WEBHOOK_TIMEOUT_SECONDS=30)
    receiver.script = [("hang", 1.5), 200]
    agent = JobAgentFactory()
    secret = webhooks.create_endpoint(agent.workspace_id, receiver.url)[1]
    finished_job(agent)
    finished_job(agent)
    assert webhooks.run_once()["delivered"] == 2
    headers = [r["headers"]["X-Jobqueue-Signature"] for r in receiver.requests]
    stamps = [int(h.split(",")[0].removeprefix("t=")) for h in headers]
    assert stamps[1] >= stamps[0] + 1
    for header, stamp, r in zip(headers, stamps, receiver.requests, strict=True):
        assert webhooks.sign(secret, stamp, r["body"]) == header


# --- the body is fixed at the transition ----------------------------------------------------

def test_a_success_then_requeue_sends_the_success(receiver):
    job = finished_job()
    webhooks.create_endpoint(job.workspace_id, receiver.url)
    WebhookDelivery.objects.all().delete()
    lifecycle.requeue_job(job.id)
    grant = lifecycle.claim_job(job.job_agent, job.id)
    lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL, message="first")
    lifecycle.requeue_job(job.id)  # before the sender ran
    assert webhooks.run_once()["delivered"] == 1
    (sent,) = [json.loads(r["body"])["job"] for r in receiver.requests]
    assert (sent["status"], sent["message"]) == ("successful", "first")
    assert Job.objects.get(id=job.id).status == states.QUEUED


def test_a_success_then_requeue_then_failure_sends_each_once(receiver):
    agent = JobAgentFactory()
    webhooks.create_endpoint(agent.workspace_id, receiver.url)
    job, grant = claimed_job(job_agent=agent)
    lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL, result={"n": 1})
    lifecycle.requeue_job(job.id)
    grant = lifecycle.claim_job(agent, job.id)
    lifecycle.report_many(agent.id, [lifecycle.ReportItem(job.id, grant.claim_id,
                                                          states.FAILURE, message="boom")])
    assert webhooks.run_once()["delivered"] == 2
    sent = sorted((d["job"]["status"], d["job"]["attempt"], d["job"]["result"])
                  for d in (json.loads(r["body"]) for r in receiver.requests))
    assert sent == [("failure", 2, {"n": 1}), ("successful", 1, {"n": 1})]


def test_a_delivery_written_before_bodies_were_fixed_gets_its_body_at_its_first_try(receiver):
    job = finished_job()
    webhooks.create_endpoint(job.workspace_id, receiver.url)
    WebhookDelivery.objects.all().delete()
    lifecycle.cancel_job(JobFactory(job_agent=job.job_agent).id)
    WebhookDelivery.objects.update(payload=None)  # as a row from before migration 0013
    assert webhooks.run_once()["delivered"] == 1
    d = WebhookDelivery.objects.get()
    assert d.payload["job"]["status"] == "cancelled"
    assert json.loads(receiver.requests[0]["body"])["id"] == str(d.id)


# --- redaction ------------------------------------------------------------------------------

def test_a_secret_an_agent_echoed_is_redacted_in_what_receivers_get(receiver):
    context = {"env": {"TOKEN": "hunter2-hook-secret"}, "n": 5}
    job, grant = claimed_job(dispatch_context=context)
    webhooks.create_endpoint(job.workspace_id, receiver.url)
    # A message that keeps the output's last characters may start inside a secret, and a cut
    # may end inside one.
    lifecycle.report_status(
        job.id, grant.claim_id, states.FAILURE,
        message="ter2-hook-secret was cut; printed hunter2-hook-secret; ends hunter2-h",
        result={"echo": "TOKEN=hunter2-hook-secret", "hunter2-hook-secret": [1]},
        external_id="ext-hunter2-hook-secret")
    assert webhooks.run_once()["delivered"] == 1
    (req,) = receiver.requests
    assert b"hunter2" not in req["body"] and b"hook-secret" not in req["body"]
    doc = json.loads(req["body"])["job"]
    assert doc["message"] == "[redacted] was cut; printed [redacted]; ends [redacted]"
    assert doc["result"] == {"echo": "TOKEN=[redacted]", "[redacted]": [1]}
    assert doc["external_id"] == "ext-[redacted]"
    # The row keeps the job as it ended; every try sends the same redacted bytes.
    assert WebhookDelivery.objects.get().payload["job"]["result"]["echo"].endswith("secret")
    assert webhooks.redeliver(WebhookDelivery.objects.values_list("id", flat=True)) == 1
    assert webhooks.run_once()["delivered"] == 1
    assert receiver.requests[1]["body"] == req["body"]


# --- endpoints per workspace ----------------------------------------------------------------

def test_racing_creates_never_pass_the_cap_on_endpoints(settings):
    conf(settings, MAX_WEBHOOKS_PER_WORKSPACE=3)
    workspace = JobAgentFactory().workspace
    other = JobAgentFactory().workspace

    def create(i, barrier):
        barrier.wait()
        try:
            webhooks.create_endpoint(workspace.id, f"http://127.0.0.1:9/{i}")
            return "made"
        except WebhookLimitReached:
            return "refused"

    assert Counter(run_threads(create, 8)) == {"made": 3, "refused": 5}
    assert WebhookEndpoint.objects.filter(workspace=workspace).count() == 3
    webhooks.create_endpoint(other.id, "http://127.0.0.1:9/other")  # its own cap


def test_a_try_without_a_deadline_of_its_own_ends_at_the_clients_timeout(receiver, settings):
    """deliver() outside the sender (no Try to cut it): httpx's own timeout is a timeout."""
    conf(settings, WEBHOOK_TIMEOUT_SECONDS=0.3)
    receiver.script = [("hang", 5)]
    agent = JobAgentFactory()
    webhooks.create_endpoint(agent.workspace_id, receiver.url)
    finished_job(agent)
    delivery = WebhookDelivery.objects.select_related("endpoint").get()
    with webhooks.client() as http:
        assert webhooks.deliver(http, delivery, 1_900_000_000) == (None, "timeout")
