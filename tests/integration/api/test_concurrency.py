"""Ten agents race for one job through a live server: one 200, nine 409."""

import threading

import pytest

from jobqueue.models import JobClaim, JobEvent
from tests.factories import JobFactory
from tests.utils import timeline_events

pytestmark = pytest.mark.django_db(transaction=True)

RACERS = 10


def test_ten_threads_claim_the_same_job(live_world):
    job = JobFactory(job_agent=live_world.agent, dispatch_context={"k": "v"})
    url = f"job-agents/{live_world.agent.id}/jobs/{job.id}/claim"
    callers = [live_world.agent_caller() for _ in range(RACERS)]
    barrier = threading.Barrier(RACERS)
    results = [None] * RACERS

    def race(i):
        barrier.wait()
        r = callers[i].post(url)
        results[i] = (r.status_code, r.json())

    threads = [threading.Thread(target=race, args=(i,)) for i in range(RACERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)

    codes = sorted(status for status, _ in results)
    assert codes == [200] + [409] * (RACERS - 1), results
    assert all(body["code"] == "job_not_claimable" for status, body in results if status == 409)
    winner = next(body for status, body in results if status == 200)
    assert winner["job"]["dispatch_context"] == {"k": "v"}
    assert JobClaim.objects.filter(job_id=job.id).count() == 1
    assert len(timeline_events(job.id, JobEvent.CLAIMED)) == 1
