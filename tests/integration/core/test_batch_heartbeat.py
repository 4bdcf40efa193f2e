"""lifecycle.heartbeat_many: the agent-level batch heartbeat, on both backends, and racing
real callers (threads with their own connections) on PostgreSQL."""

import random
import uuid

import pytest
from django.db import connection
from django.db.models.functions import Now

from jobqueue import lifecycle, states
from jobqueue.db import NowPlusSeconds, db_now
from jobqueue.exceptions import InvalidInput
from jobqueue.models import Job, JobClaim, JobEvent
from tests.factories import JobAgentFactory, JobFactory, WorkspaceFactory
from tests.utils import final_state_is_consistent, run_threads

pytestmark = pytest.mark.django_db(transaction=True)


def claim_many(agent, n):
    JobFactory.create_batch(n, job_agent=agent)
    grants = lifecycle.claim_next_jobs(agent, n)
    assert len(grants) == n
    return grants


def pairs_of(grants):
    return [(g.job.id, g.claim_id) for g in grants]


def job_snapshot(ids):
    return {
        row["id"]: row
        for row in Job.objects.filter(id__in=ids).values(
            "id", "status", "updated_at", "attempt", "last_claim_id", "message"
        )
    }


def test_renews_every_live_claim_from_database_now_and_keeps_order():
    agent = JobAgentFactory(lease_seconds=30)
    grants = claim_many(agent, 5)
    JobClaim.objects.update(claim_expires_at=NowPlusSeconds(2))
    before = job_snapshot([g.job.id for g in grants])
    request = list(reversed(pairs_of(grants)))
    t0 = db_now()
    out = lifecycle.heartbeat_many(agent.id, request)
    t1 = db_now()
    assert [r.job_id for r in out.results] == [p[0] for p in request]
    assert all(r.renewed and r.code is None for r in out.results)
    assert t0 <= out.server_time <= t1
    for r in out.results:
        claim = JobClaim.objects.get(job_id=r.job_id)
        assert claim.claim_expires_at == r.claim_expires_at
        assert 29.9 <= (claim.claim_expires_at - out.server_time).total_seconds() <= 30.1
        assert claim.heartbeat_at is not None
    # Heartbeats never write the job table.
    assert job_snapshot([g.job.id for g in grants]) == before
    assert not JobEvent.objects.filter(kind=JobEvent.STALE_WRITE_REFUSED).exists()


def test_each_refusal_has_its_code_and_changes_nothing():
    ws = WorkspaceFactory()
    agent = JobAgentFactory(workspace=ws)
    other_agent = JobAgentFactory(workspace=ws)
    live, expired, released, cancelled, finished, requeued = claim_many(agent, 6)
    (foreign,) = claim_many(other_agent, 1)

    JobClaim.objects.filter(job_id=expired.job.id).update(claim_expires_at=NowPlusSeconds(-1))
    expired_at = JobClaim.objects.get(job_id=expired.job.id).claim_expires_at
    lifecycle.release_job(released.job.id, released.claim_id)
    reclaimed = lifecycle.claim_job(agent, released.job.id)
    lifecycle.cancel_job(cancelled.job.id)
    lifecycle.report_status(finished.job.id, finished.claim_id, states.SUCCESSFUL)
    lifecycle.requeue_job(requeued.job.id)
    unknown = uuid.uuid4()

    request = [
        (live.job.id, live.claim_id),
        (expired.job.id, expired.claim_id),
        (released.job.id, released.claim_id),
        (cancelled.job.id, cancelled.claim_id),
        (finished.job.id, finished.claim_id),
        (requeued.job.id, requeued.claim_id),
        (unknown, uuid.uuid4()),
        (foreign.job.id, foreign.claim_id),
    ]
    ids = [p[0] for p in request]
    before = job_snapshot(ids)
    claims_before = {c.job_id: c.claim_expires_at for c in JobClaim.objects.all()}
    out = lifecycle.heartbeat_many(agent.id, request)

    assert [(r.job_id, r.renewed, r.code) for r in out.results] == [
        (live.job.id, True, None),
        (expired.job.id, False, "lease_expired"),
        (released.job.id, False, "claim_superseded"),
        (cancelled.job.id, False, "job_cancelled"),
        (finished.job.id, False, "job_finished"),
        (requeued.job.id, False, "claim_superseded"),
        (unknown, False, "not_found"),
        (foreign.job.id, False, "not_found"),  # another agent's job: not even its status
    ]
    assert all(r.claim_expires_at is None for r in out.results[1:])
    # Nothing but the live claim moved; the expired lease stays expired (never revived).
    assert job_snapshot(ids) == before
    claims_after = {c.job_id: c.claim_expires_at for c in JobClaim.objects.all()}
    assert claims_after[expired.job.id] == expired_at
    assert claims_after[reclaimed.job.id] == claims_before[reclaimed.job.id]
    assert claims_after[foreign.job.id] == claims_before[foreign.job.id]
    assert claims_after[live.job.id] > claims_before[live.job.id]
    # Every refusal on one of this agent's jobs is on the job's timeline, as for one heartbeat.
    refused = JobEvent.objects.filter(kind=JobEvent.STALE_WRITE_REFUSED)
    assert sorted((e.job_id, e.detail["code"]) for e in refused) == sorted(
        [
            (expired.job.id, "lease_expired"),
            (released.job.id, "claim_superseded"),
            (cancelled.job.id, "job_cancelled"),
            (finished.job.id, "job_finished"),
            (requeued.job.id, "claim_superseded"),
        ]
    )
    assert all(e.detail["operation"] == "heartbeat" for e in refused)


def test_same_answers_as_single_heartbeat():
    """The batch and the single path agree on every refusal code."""
    from jobqueue.exceptions import Conflict

    agent = JobAgentFactory()
    a, b, c = claim_many(agent, 3)
    JobClaim.objects.filter(job_id=a.job.id).update(claim_expires_at=NowPlusSeconds(-1))
    lifecycle.cancel_job(b.job.id)
    lifecycle.report_status(c.job.id, c.claim_id, states.FAILURE)
    batch = lifecycle.heartbeat_many(agent.id, pairs_of([a, b, c]))
    for grant, outcome in zip([a, b, c], batch.results, strict=True):
        with pytest.raises(Conflict) as err:
            lifecycle.heartbeat(grant.job.id, grant.claim_id, job_agent_id=agent.id)
        assert err.value.code == outcome.code


def test_workspace_scope():
    agent = JobAgentFactory()
    (grant,) = claim_many(agent, 1)
    other_ws = WorkspaceFactory()
    out = lifecycle.heartbeat_many(agent.id, pairs_of([grant]), workspace_id=other_ws.id)
    assert out.results[0].code == "not_found"
    out = lifecycle.heartbeat_many(agent.id, pairs_of([grant]), workspace_id=agent.workspace_id)
    assert out.results[0].renewed


@pytest.mark.parametrize("bad", [[], "not a list", "DUPLICATE", "TOO_MANY"])
def test_bad_input_is_refused_whole_and_changes_nothing(bad, settings):
    """The batch's rules (inputs.heartbeat_batch). Malformed items (not a pair, not a UUID)
    never reach the lifecycle: the edge refuses them
    (tests/integration/api/test_batch_endpoints.py)."""
    settings.JOBQUEUE = {"MAX_HEARTBEAT_BATCH": 3}
    agent = JobAgentFactory()
    grants = claim_many(agent, 2)
    if bad == "DUPLICATE":
        bad = [pairs_of(grants)[0], pairs_of(grants)[1], pairs_of(grants)[0]]
    elif bad == "TOO_MANY":
        bad = pairs_of(grants) + [(uuid.uuid4(), uuid.uuid4())] * 2
    before = {c.job_id: c.claim_expires_at for c in JobClaim.objects.all()}
    with pytest.raises(InvalidInput) as err:
        lifecycle.heartbeat_many(agent.id, bad)
    assert err.value.code == "validation_error"
    assert {c.job_id: c.claim_expires_at for c in JobClaim.objects.all()} == before
    assert not JobEvent.objects.filter(kind=JobEvent.STALE_WRITE_REFUSED).exists()


@pytest.mark.postgres_only
def test_batch_heartbeat_does_not_touch_job_rows_on_postgres():
    """xmin of every job row and the job table's write counters stay put."""
    agent = JobAgentFactory()
    grants = claim_many(agent, 20)

    def xmins():
        with connection.cursor() as cur:
            cur.execute("SELECT id, xmin::text FROM job ORDER BY id")
            return cur.fetchall()

    before = xmins()
    for _ in range(5):
        out = lifecycle.heartbeat_many(agent.id, pairs_of(grants))
        assert all(r.renewed for r in out.results)
    assert xmins() == before


# --- races on PostgreSQL: threads, each with its own connection ----------------------------


@pytest.mark.postgres_only
def test_race_batch_heartbeats_against_reapers_never_revive_and_never_deadlock():
    """Two agents' worth of batch heartbeats (in opposite orders) race two reapers over
    claims that expire while they run. Nothing deadlocks; a claim already expired is never
    renewed; every expired claim is reaped exactly once; invariant 2 holds throughout."""
    agent = JobAgentFactory(lease_seconds=5, max_attempts=5)
    grants = claim_many(agent, 60)
    pairs = pairs_of(grants)
    dead = {g.job.id for g in grants[::3]}  # expired before the race starts
    JobClaim.objects.filter(job_id__in=dead).update(claim_expires_at=NowPlusSeconds(-1))
    # The others expire during the race unless a heartbeat gets there first.
    JobClaim.objects.exclude(job_id__in=dead).update(claim_expires_at=NowPlusSeconds(0.3))
    seen: list = []

    def work(i, barrier):
        barrier.wait()
        rounds = []
        for n in range(25):
            if i < 2:
                order = pairs if (i + n) % 2 else list(reversed(pairs))
                out = lifecycle.heartbeat_many(agent.id, order)
                rounds.append(out)
            else:
                lifecycle.reap_expired_claims_once(7 + i)
        return rounds

    results = run_threads(work, 4)
    for rounds in results[:2]:
        for out in rounds:
            seen.extend(out.results)
            for r in out.results:
                if r.job_id in dead:
                    assert not r.renewed and r.code in {"lease_expired", "claim_superseded"}
                if r.renewed:
                    assert r.claim_expires_at > out.server_time
    # Sweep what is left, then check every job.
    lifecycle.reap_expired_claims_once(1000)
    final_state_is_consistent()
    for job_id in dead:
        assert Job.objects.get(id=job_id).status == states.QUEUED
    reaped = list(
        JobEvent.objects.filter(kind=JobEvent.REAPED).values_list("job_id", flat=True)
    )
    assert len(reaped) == len(set(reaped))  # each claim reaped once
    assert dead <= set(reaped)
    # Each job still in progress has its first claim; each reaped one none.
    for job_id, claim_id in pairs:
        job = Job.objects.get(id=job_id)
        if job.status == states.IN_PROGRESS:
            assert JobClaim.objects.get(job_id=job_id).claim_id == claim_id
            assert job_id not in reaped
        else:
            assert job.status == states.QUEUED and job_id in reaped
    assert seen  # the heartbeats did run


@pytest.mark.postgres_only
def test_race_batch_heartbeats_against_reports_cancels_and_requeues():
    """Each job gets one competing write (report, cancel or requeue) from its own thread
    while two threads batch-heartbeat all of them. Once a job's claim is gone, no later
    heartbeat renews it, and each refusal names what happened."""
    agent = JobAgentFactory(lease_seconds=60)
    grants = claim_many(agent, 30)
    pairs = pairs_of(grants)
    action = {}
    for k, g in enumerate(grants):
        action[g.job.id] = ["report", "cancel", "requeue"][k % 3]
    expected_code = {"report": "job_finished", "cancel": "job_cancelled",
                     "requeue": "claim_superseded"}

    def work(i, barrier):
        barrier.wait()
        if i < 2:
            outs = []
            for _ in range(15):
                order = random.sample(pairs, len(pairs))
                outs.append(lifecycle.heartbeat_many(agent.id, order))
            return outs
        for g in grants[i - 2 :: 3]:
            kind = action[g.job.id]
            if kind == "report":
                lifecycle.report_status(g.job.id, g.claim_id, states.SUCCESSFUL)
            elif kind == "cancel":
                lifecycle.cancel_job(g.job.id)
            else:
                lifecycle.requeue_job(g.job.id)
        return None

    results = run_threads(work, 5)
    for outs in results[:2]:
        gone = set()
        for out in outs:
            for r in out.results:
                if r.job_id in gone:
                    assert not r.renewed  # never renewed after it was refused
                if not r.renewed:
                    gone.add(r.job_id)
                    assert r.code == expected_code[action[r.job_id]]
    final_state_is_consistent()
    assert not JobClaim.objects.exists()
    statuses = dict(Job.objects.values_list("id", "status"))
    for job_id, kind in action.items():
        assert statuses[job_id] == {"report": states.SUCCESSFUL, "cancel": states.CANCELLED,
                                    "requeue": states.QUEUED}[kind]


def test_race_batch_heartbeats_across_threads_on_either_backend():
    """Threads renewing overlapping sets at once (on SQLite, writers queue): all renewed,
    the job table untouched."""
    agent = JobAgentFactory()
    grants = claim_many(agent, 12)
    pairs = pairs_of(grants)
    before = job_snapshot([p[0] for p in pairs])

    def work(i, barrier):
        barrier.wait()
        return [
            lifecycle.heartbeat_many(agent.id, random.sample(pairs, 8)) for _ in range(5)
        ]

    for outs in run_threads(work, 3):
        for out in outs:
            assert all(r.renewed for r in out.results)
    assert job_snapshot([p[0] for p in pairs]) == before
    assert JobClaim.objects.filter(claim_expires_at__gt=Now()).count() == 12
