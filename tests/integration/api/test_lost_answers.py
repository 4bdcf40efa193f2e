"""Lost answers over a real network: the request reaches the real server, its answer never
comes back (a proxy drops it). The reference client then resends the claim-next with the same
Idempotency-Key and gets the one job it was granted; a report is reconciled read-only."""

from urllib.parse import urlparse

import pytest
from jobqueue_client.client import AgentClient

from jobqueue import states
from jobqueue.models import Job, JobClaim, JobEvent
from tests.factories import JobFactory
from tests.netproxy import TcpProxy
from tests.utils import events_of_kind

pytestmark = pytest.mark.django_db(transaction=True)


class AnswerDroppingProxy(TcpProxy):
    """Forwards requests; drops the first `drop` answers (closes the client's connection
    when the server starts answering, after the server has done the work)."""

    def __init__(self, *args, drop=1, **kwargs):
        super().__init__(*args, **kwargs)
        self.drop = drop
        self.dropped = 0

    def forwards(self, from_server):
        if not from_server:
            return True
        with self._lock:
            lose = self.dropped < self.drop
            self.dropped += lose
        return not lose  # when lost, the server did the work; its answer goes nowhere


@pytest.fixture
def proxied(live_world):
    url = urlparse(live_world.base_url)
    proxy = AnswerDroppingProxy(url.hostname, url.port).start()
    client = AgentClient(f"http://127.0.0.1:{proxy.port}", str(live_world.workspace.id),
                         str(live_world.agent.id), live_world.token, timeout=10,
                         holder="test-host:1")
    yield live_world, proxy, client
    client.close()
    proxy.stop()


def test_a_claim_next_whose_answer_is_lost_gets_the_same_grant_again(proxied):
    world, proxy, client = proxied
    JobFactory(job_agent=world.agent)
    JobFactory(job_agent=world.agent)
    claim = client.claim_next()
    assert proxy.dropped == 1  # the first answer never arrived
    assert claim is not None
    (row,) = JobClaim.objects.filter(job_agent=world.agent)
    assert str(row.claim_id) == claim.claim_id and row.holder == "test-host:1"
    assert Job.objects.filter(job_agent=world.agent, status=states.QUEUED).count() == 1
    assert len(events_of_kind(JobEvent.CLAIMED)) == 1


def test_a_report_whose_answer_is_lost_is_reconciled_without_writing(proxied):
    world, proxy, client = proxied
    proxy.drop = 0
    JobFactory(job_agent=world.agent)
    claim = client.claim_next()
    proxy.drop, proxy.dropped = 1, 0
    with pytest.raises(Exception) as lost:
        client.report(claim.job_id, claim.claim_id, "successful")
    assert type(lost.value).__name__ == "TransportError"
    events = JobEvent.objects.count()
    state = client.claim_state(claim.job_id, claim.claim_id)
    assert state["current"] is False and state["final_status"] == "successful"
    assert JobEvent.objects.count() == events
