"""Lifecycle rules under racing callers: real threads and processes, each with its own
database connection. The PostgreSQL pass runs all of them; the SQLite pass runs those that
are not marked postgres_only (SQLite serializes writers, so the same rules must hold)."""

import json
import random
import time
from collections import Counter
from datetime import timedelta

import pytest
import time_machine
from django.db import connection
from django.db.models import Count
from django.test.utils import CaptureQueriesContext

from jobqueue import lifecycle, states
from jobqueue.db import NowPlusSeconds, db_now
from jobqueue.exceptions import Conflict, JobNotClaimable
from jobqueue.models import Job, JobAgent, JobClaim, JobEvent
from tests.factories import JobAgentFactory, JobFactory, claimed_job
from tests.utils import events_of_kind, run_threads, spawn, statements_sent

pytestmark = pytest.mark.django_db(transaction=True)


def bulk_jobs(agent: JobAgent, n: int, **fields) -> list:
    jobs = [
        Job(
            workspace_id=agent.workspace_id,
            job_agent=agent,
            max_attempts=agent.max_attempts,
            initial_max_attempts=agent.max_attempts,
            **fields,
        )
        for _ in range(n)
    ]
    Job.objects.bulk_create(jobs, batch_size=1000)
    return [j.id for j in jobs]


@pytest.mark.postgres_only
def test_16_concurrent_claimers_drain_2000_jobs_each_exactly_once():
    agent = JobAgentFactory()
    ids = set(bulk_jobs(agent, 2000))

    def worker(i, barrier):
        me = JobAgent.objects.get(id=agent.id)
        barrier.wait()
        got = []
        while True:
            grant = lifecycle.claim_next_job(me)
            if grant is None:
                return got
            lifecycle.report_status(grant.job.id, grant.claim_id, states.SUCCESSFUL)
            got.append(grant.job.id)

    results = run_threads(worker, 16)
    claimed = [job_id for got in results for job_id in got]
    assert len(claimed) == 2000 and set(claimed) == ids  # none twice, none missing
    assert sum(1 for got in results if got) > 1  # the work was really shared
    assert Job.objects.filter(status=states.SUCCESSFUL, attempt=1).count() == 2000
    assert JobClaim.objects.count() == 0
    per_job = Counter(e.job_id for e in events_of_kind(JobEvent.CLAIMED))
    assert set(per_job.values()) == {1}


def test_two_callers_race_for_the_same_named_job():
    agent = JobAgentFactory()
    rounds = 15
    jobs = [JobFactory(job_agent=agent).id for _ in range(rounds)]

    def racer(i, barrier):
        me = JobAgent.objects.get(id=agent.id)
        outcomes = []
        for job_id in jobs:
            barrier.wait()
            try:
                lifecycle.claim_job(me, job_id)
                outcomes.append("won")
            except JobNotClaimable as exc:
                assert exc.code == "job_not_claimable"
                outcomes.append("refused")
        return outcomes

    a, b = run_threads(racer, 2)
    for won_a, won_b in zip(a, b, strict=True):
        assert sorted([won_a, won_b]) == ["refused", "won"]
    assert JobClaim.objects.count() == rounds
    assert set(Job.objects.values_list("attempt", flat=True)) == {1}


def test_heartbeat_racing_the_reaper_one_or_the_other_never_both():
    agent = JobAgentFactory(max_attempts=100)
    rounds = 20
    outcomes = Counter()
    for _ in range(rounds):
        job, grant = claimed_job(job_agent=agent)
        # Expires a few milliseconds from now: the two callers straddle the expiry.
        JobClaim.objects.filter(job=job).update(claim_expires_at=NowPlusSeconds(0.02))

        def caller(i, barrier, job=job, grant=grant):
            barrier.wait()
            time.sleep(random.uniform(0, 0.04))
            if i == 0:
                try:
                    lifecycle.heartbeat(job.id, grant.claim_id)
                    return "renewed"
                except Conflict as exc:
                    return exc.code
            return lifecycle.reap_expired_claims_once(10).reaped

        heartbeat_outcome, reaped = run_threads(caller, 2)
        row = Job.objects.get(id=job.id)
        claim = JobClaim.objects.filter(job=job).first()
        if heartbeat_outcome == "renewed":
            # The heartbeat won: lease extended, the job not reaped.
            assert reaped == 0
            assert row.status == states.IN_PROGRESS and claim is not None
            assert claim.claim_expires_at > db_now() + timedelta(seconds=30)
            outcomes["heartbeat"] += 1
        else:
            # Either the reaper took it (heartbeat refused as superseded), or the lease had
            # already expired and neither the heartbeat nor (yet) the reaper could act.
            assert heartbeat_outcome in {"claim_superseded", "lease_expired"}
            if reaped:
                assert row.status == states.QUEUED and claim is None
                outcomes["reaper"] += 1
            else:
                assert heartbeat_outcome == "lease_expired"
                assert claim is not None and claim.claim_expires_at < db_now()
                outcomes["expired_first"] += 1
        # Never both: a renewed heartbeat on a reaped job is impossible by the checks above.
        lifecycle.cancel_job(job.id)
    assert sum(outcomes.values()) == rounds


def _expired_claims(agent: JobAgent, n: int, attempt: int) -> list:
    ids = bulk_jobs(agent, n, status=states.IN_PROGRESS, attempt=attempt)
    JobClaim.objects.bulk_create(
        [
            JobClaim(job_id=i, job_agent=agent, attempt=attempt, lease_seconds=60,
                     claim_expires_at=db_now() - timedelta(seconds=5))
            for i in ids
        ],
        batch_size=1000,
    )
    return ids


@pytest.mark.postgres_only
def test_three_reaper_processes_reap_5000_expired_claims_exactly_once():
    agent = JobAgentFactory(max_attempts=3)
    requeue_ids = _expired_claims(agent, 2500, attempt=2)
    expire_ids = _expired_claims(agent, 2500, attempt=3)
    procs = [
        spawn("manage.py", "reap_claims", "--batch-size", "100", "--json") for _ in range(3)
    ]
    totals = Counter()
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
        line = json.loads(out.strip().splitlines()[-1])
        totals["requeued"] += line["requeued"]
        totals["expired"] += line["expired"]
    assert totals == {"requeued": 2500, "expired": 2500}
    assert JobClaim.objects.count() == 0
    assert Job.objects.filter(id__in=requeue_ids, status=states.QUEUED, attempt=2).count() == 2500
    assert Job.objects.filter(id__in=expire_ids, status=states.EXPIRED, attempt=3).count() == 2500
    per_job = (
        JobEvent.objects.filter(kind__in=[JobEvent.REAPED, JobEvent.EXPIRED])
        .values("job_id")
        .annotate(n=Count("id"))
    )
    assert len(per_job) == 5000 and {row["n"] for row in per_job} == {1}


def test_several_processes_claim_at_once():
    """Real processes, each with its own connection, drain the queue: every job once."""
    agent = JobAgentFactory()
    ids = {str(i) for i in bulk_jobs(agent, 300)}
    procs = [spawn("-m", "tests.procs", "claim_drain", str(agent.id)) for _ in range(4)]
    seen = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
        seen.extend(out.split())
    assert len(seen) == 300 and set(seen) == ids
    assert Job.objects.filter(status=states.SUCCESSFUL).count() == 300


def test_heartbeats_never_write_the_job_table():
    job, grant = claimed_job()
    is_pg = connection.vendor == "postgresql"
    if is_pg:
        with connection.cursor() as cur:
            cur.execute("SELECT xmin::text, ctid::text FROM job WHERE id = %s", [job.id])
            before = cur.fetchone()
    with CaptureQueriesContext(connection) as captured:
        for _ in range(20):
            lifecycle.heartbeat(job.id, grant.claim_id, job_agent_id=job.job_agent_id)
    writes = [q["sql"] for q in captured.captured_queries
              if q["sql"].lstrip().upper().startswith(("UPDATE", "INSERT", "DELETE"))]
    assert len(writes) == 20
    assert all(w.lstrip().upper().startswith("UPDATE JOB_CLAIM") for w in writes), writes
    assert not any('"job"' in w or " job " in w.replace("job_claim", "") for w in writes)
    if is_pg:
        # PostgreSQL's own bookkeeping: any UPDATE of the row, even a no-op, would give it a
        # new tuple version (xmin) and location (ctid).
        with connection.cursor() as cur:
            cur.execute("SELECT xmin::text, ctid::text FROM job WHERE id = %s", [job.id])
            assert cur.fetchone() == before


def test_lease_arithmetic_ignores_the_app_servers_clock():
    agent = JobAgentFactory(lease_seconds=60)
    job = JobFactory(job_agent=agent)
    real_now = db_now()
    # Python's clock jumps a day ahead (and would have every lease expired if used)...
    with time_machine.travel(real_now + timedelta(days=1), tick=True):
        grant = lifecycle.claim_job(agent, job.id)
        assert abs((grant.claimed_at - real_now).total_seconds()) < 30
        assert lifecycle.reap_expired_claims_once(10).reaped == 0
        hb = lifecycle.heartbeat(job.id, grant.claim_id)
        assert abs((hb.claim_expires_at - real_now).total_seconds() - 60) < 30
    # ...and a day behind (which would keep every lease alive if used).
    JobClaim.objects.filter(job=job).update(claim_expires_at=NowPlusSeconds(-1))
    with time_machine.travel(real_now - timedelta(days=1), tick=True):
        with pytest.raises(Conflict) as refused:
            lifecycle.heartbeat(job.id, grant.claim_id)
        assert refused.value.code == "lease_expired"
        assert lifecycle.reap_expired_claims_once(10).requeued == 1


def test_claim_uses_the_partial_index_over_many_finished_jobs():
    """EXPLAIN of the locking statement production sends for a claim-next (recorded on its
    way to the database): PostgreSQL's one-statement claim, SQLite's ORM query."""
    is_pg = connection.vendor == "postgresql"
    agent = JobAgentFactory()
    bulk_jobs(agent, 20000 if is_pg else 5000, status=states.SUCCESSFUL,
              completed_at=db_now(), attempt=1)
    bulk_jobs(agent, 20)
    with connection.cursor() as cur:
        cur.execute("ANALYZE job" if is_pg else "ANALYZE")
    with statements_sent() as sent:
        assert len(lifecycle.claim_next_jobs(agent, 1)) == 1
    locking = [(sql, params) for sql, params in sent if "ORDER BY" in sql]
    sql, params = locking[0]
    with connection.cursor() as cur:
        cur.execute(("EXPLAIN " if is_pg else "EXPLAIN QUERY PLAN ") + sql, params)
        plan = "\n".join(str(row[-1]) for row in cur.fetchall())
    if is_pg:  # the locking CTE; the statement then answers its few rows in claim order
        assert len(sent) == 1
        plan = plan.split("CTE locked", 1)[1].split("CTE claimed", 1)[0]
    assert "job_claim_order_idx" in plan, plan
    # The index yields the claim order: no sort step over the candidates.
    assert ("Sort" not in plan) if is_pg else ("TEMP B-TREE" not in plan), plan
