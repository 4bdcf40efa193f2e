"""Acceptance (issue 32): a webhook receiver that holds every POST does not hold up the
maintenance loop. A real `run_maintenance --loop` process sends to a receiver that never
answers while another job's lease expires: its reaper requeues that job all the same, and
SIGTERM stops the process at once, the held try put back to be sent again. Both backends."""

import threading

import pytest

from jobqueue import lifecycle, states
from jobqueue.maintenance import webhooks
from jobqueue.models import Job, JobEvent, WebhookAttempt, WebhookDelivery
from tests.webhook_receiver import Receiver

from .harness import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_a_receiver_holding_every_post_neither_delays_the_reaper_nor_a_stop(stack, make_agent):
    held = threading.Event()
    receiver = Receiver()
    receiver.default = ("wait", held)  # holds each POST until the test ends (or 60 s)
    try:
        producer_agent, _ = make_agent(name="producer")
        webhooks.create_endpoint(producer_agent.workspace_id, receiver.url)
        for _ in range(5):  # five finished jobs: five deliveries to the stuck receiver
            job, _ = lifecycle.create_job(workspace=producer_agent.workspace,
                                          job_agent=producer_agent)
            grant = lifecycle.claim_job(producer_agent, job.id)
            lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL)
        loop = stack.start_maintenance(JOBQUEUE_WEBHOOK_TIMEOUT_SECONDS=300,
                                       JOBQUEUE_WEBHOOK_LEASE_SECONDS=600,
                                       JOBQUEUE_WEBHOOK_INTERVAL_SECONDS=0.2,
                                       JOBQUEUE_REAPER_INTERVAL_SECONDS=0.2)
        receiver.wait_for(1)  # the loop's sender is stuck in a POST

        # An agent that crashed holding a 2 s lease: nobody heartbeats it.
        crashed_agent, _ = make_agent(lease_seconds=2, name="crashed")
        stranded, _ = lifecycle.create_job(workspace=crashed_agent.workspace,
                                           job_agent=crashed_agent)
        lifecycle.claim_job(crashed_agent, stranded.id)
        wait_for(lambda: Job.objects.get(id=stranded.id).status == states.QUEUED, 60,
                 "the loop's reaper to requeue the expired lease", on_fail=loop.output)
        assert JobEvent.objects.filter(job_id=stranded.id, kind=JobEvent.REAPED).count() == 1
        assert not held.is_set() and WebhookAttempt.objects.count() == 0  # still stuck

        # SIGTERM while the POSTs are held: the loop cuts them and exits 0 (Proc.stop waits
        # at most 30 s; the receiver would hold them for 60).
        assert loop.stop(timeout=30) == 0, loop.output()
        assert "maintenance stopped" in loop.output()
        assert not held.is_set()
        assert set(WebhookDelivery.objects.values_list("status", "attempts")) == {
            ("pending", 0)}  # put back, not counted: sent again by the next sender
    finally:
        held.set()
        receiver.close()
