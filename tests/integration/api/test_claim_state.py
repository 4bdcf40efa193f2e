"""GET jobs/{job_id}/claims/{claim_id}: read-only reconciliation. It answers with the codes a
write would get, and writes nothing: no row version changes, no table counter moves."""

import uuid

import pytest
from django.db import connection

from jobqueue import lifecycle, states
from jobqueue.db import NowPlusSeconds
from jobqueue.models import Job, JobClaim, JobEvent
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db

TABLES = ("job", "job_claim", "job_event", "job_agent", "job_group")


def _claimed(world, **fields):
    job = JobFactory(job_agent=world.agent, **fields)
    return lifecycle.claim_job(world.agent, job.id)


def _check(world, job_id, claim_id, caller=None):
    return (caller or world.agent_caller()).get(f"jobs/{job_id}/claims/{claim_id}")


def _write_code(world, job_id, claim_id):
    r = world.agent_caller().put(f"jobs/{job_id}/status",
                                 json={"claim_id": str(claim_id), "status": "in_progress"})
    return r.json().get("code")


def test_a_current_claim(world):
    grant = _claimed(world)
    r = _check(world, grant.job.id, grant.claim_id)
    assert r.status_code == 200
    body = r.json()
    assert body["current"] is True and body["lease_state"] == "active"
    assert body["attempt"] == 1 and "code" not in body
    claim = JobClaim.objects.get(job_id=grant.job.id)
    expires = claim.claim_expires_at.isoformat().replace("+00:00", "Z")
    assert body["claim_expires_at"] == expires
    assert body["server_time"] <= body["claim_expires_at"]
    # The workspace key may ask too.
    assert _check(world, grant.job.id, grant.claim_id, world.producer()).json()["current"]


def test_an_expired_lease_not_yet_reaped_is_still_current(world):
    grant = _claimed(world)
    JobClaim.objects.filter(job_id=grant.job.id).update(claim_expires_at=NowPlusSeconds(-5))
    body = _check(world, grant.job.id, grant.claim_id).json()
    assert body["current"] is True and body["lease_state"] == "expired"
    # What the writes say: a heartbeat is refused, a terminal report is still accepted.
    hb = world.agent_caller().post(f"jobs/{grant.job.id}/heartbeat",
                                   json={"claim_id": str(grant.claim_id)})
    assert hb.json()["code"] == "lease_expired"


@pytest.mark.parametrize("ending, code, final_status", [
    ("release", "claim_superseded", None),
    ("requeue", "claim_superseded", None),
    ("cancel", "job_cancelled", None),
    ("report", "job_finished", "successful"),
    ("reap", "claim_superseded", None),
    ("reap_last", "job_finished", "expired"),
    ("unknown", "claim_superseded", None),
])
def test_a_claim_that_is_gone_gets_the_code_a_write_would(world, ending, code, final_status):
    grant = _claimed(world, max_attempts=1 if ending == "reap_last" else 3)
    job_id, claim_id = grant.job.id, grant.claim_id
    if ending == "release":
        lifecycle.release_job(job_id, claim_id)
    elif ending == "requeue":
        lifecycle.requeue_job(job_id)
    elif ending == "cancel":
        lifecycle.cancel_job(job_id)
    elif ending == "report":
        lifecycle.report_status(job_id, claim_id, states.SUCCESSFUL)
    elif ending in ("reap", "reap_last"):
        JobClaim.objects.filter(job_id=job_id).update(claim_expires_at=NowPlusSeconds(-5))
        lifecycle.reap_expired_claims_once(100)
    else:
        claim_id = uuid.uuid4()
    body = _check(world, job_id, claim_id).json()
    assert body["current"] is False and body["code"] == code
    assert body.get("final_status") == final_status
    assert set(body) <= {"current", "code", "final_status", "server_time"}
    assert _write_code(world, job_id, claim_id) == code


def test_a_reclaimed_job_tells_the_old_claim_it_was_superseded(world):
    grant = _claimed(world)
    lifecycle.release_job(grant.job.id, grant.claim_id)
    again = lifecycle.claim_job(world.agent, grant.job.id)
    assert _check(world, grant.job.id, grant.claim_id).json()["code"] == "claim_superseded"
    now = _check(world, grant.job.id, again.claim_id).json()
    assert now["current"] is True and now["attempt"] == 2


@pytest.mark.parametrize("path", ["jobs/{job}/claims/not-a-uuid", "jobs/nope/claims/{claim}",
                                  "jobs/{other}/claims/{claim}"])
def test_unknown_or_foreign_ids_are_404(world, path):
    grant = _claimed(world)
    other = lifecycle.claim_job(world.other_agent, JobFactory(job_agent=world.other_agent).id)
    r = world.agent_caller().get(path.format(job=grant.job.id, claim=grant.claim_id,
                                             other=other.job.id))
    assert r.status_code == 404 and r.json()["code"] == "not_found"


def _versions(job_id):
    """Row versions of the job and its claim (PostgreSQL's xmin, ctid)."""
    with connection.cursor() as cur:
        cur.execute("SELECT xmin::text, ctid::text FROM job WHERE id = %s", [job_id])
        job = cur.fetchone()
        cur.execute("SELECT xmin::text, ctid::text FROM job_claim WHERE job_id = %s", [job_id])
        claim = cur.fetchone()
    return job, claim


def _counters():
    """This transaction's row writes per table (PostgreSQL), or the connection's total
    changes (SQLite)."""
    with connection.cursor() as cur:
        if connection.vendor == "postgresql":
            cur.execute(
                "SELECT relname, n_tup_ins, n_tup_upd, n_tup_del, n_tup_hot_upd "
                "FROM pg_stat_xact_user_tables WHERE relname = ANY(%s) ORDER BY relname",
                [list(TABLES)],
            )
            return cur.fetchall()
        cur.execute("SELECT total_changes()")
        return cur.fetchall()


@pytest.mark.parametrize("state", ["current", "expired", "gone"])
def test_reconciliation_writes_nothing(world, state):
    grant = _claimed(world)
    if state == "expired":
        JobClaim.objects.filter(job_id=grant.job.id).update(claim_expires_at=NowPlusSeconds(-5))
    if state == "gone":
        lifecycle.release_job(grant.job.id, grant.claim_id)
    caller = world.agent_caller()
    _check(world, grant.job.id, grant.claim_id, caller)  # the agent's last_seen_at, if due
    before_rows = (list(Job.objects.values_list("id", "updated_at", "status")),
                   list(JobClaim.objects.values_list("job_id", "claim_expires_at",
                                                     "heartbeat_at")),
                   JobEvent.objects.count())
    before = _counters()
    pg = connection.vendor == "postgresql"
    versions = _versions(grant.job.id) if pg else None
    for _ in range(3):
        assert _check(world, grant.job.id, grant.claim_id, caller).status_code == 200
    assert _counters() == before
    if pg:
        assert _versions(grant.job.id) == versions
    after_rows = (list(Job.objects.values_list("id", "updated_at", "status")),
                  list(JobClaim.objects.values_list("job_id", "claim_expires_at",
                                                    "heartbeat_at")),
                  JobEvent.objects.count())
    assert after_rows == before_rows


@pytest.mark.parametrize("reaped", [False, True])
def test_a_claim_whose_clock_ran_out_gets_deadline_exceeded(world, reaped):
    grant = _claimed(world, max_runtime_seconds=60)
    JobClaim.objects.filter(job_id=grant.job.id).update(deadline_at=NowPlusSeconds(-1),
                                                        claim_expires_at=NowPlusSeconds(-1))
    if reaped:
        lifecycle.reap_expired_claims_once(100)
        assert not JobClaim.objects.filter(job_id=grant.job.id).exists()
    body = _check(world, grant.job.id, grant.claim_id).json()
    assert body["current"] is False and body["code"] == "deadline_exceeded"
    hb = world.agent_caller().post(f"jobs/{grant.job.id}/heartbeat",
                                   json={"claim_id": str(grant.claim_id)})
    assert hb.status_code == 409 and hb.json()["code"] == "deadline_exceeded"
