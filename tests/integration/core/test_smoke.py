import pytest

from jobqueue import lifecycle, states
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db(transaction=True)


def test_basic_flow():
    job = JobFactory(dispatch_context={"secret": "s3cr3t"})
    grant = lifecycle.claim_next_job(job.job_agent)
    assert grant.job.id == job.id and grant.attempt == 1
    assert grant.claim_expires_at > grant.claimed_at
    hb = lifecycle.heartbeat(job.id, grant.claim_id)
    assert hb.claim_expires_at >= grant.claim_expires_at
    done = lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL, result={"ok": 1})
    assert done.status == states.SUCCESSFUL and done.completed_at
    again = lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL)
    assert again.status == states.SUCCESSFUL
