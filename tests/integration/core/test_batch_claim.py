"""lifecycle.claim_next_jobs(agent, limit): the batch claim, on both backends, and racing
threads with their own connections (PostgreSQL: SKIP LOCKED; SQLite: queued writers)."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobqueue import lifecycle, states
from jobqueue.exceptions import InvalidInput
from jobqueue.models import Job, JobClaim, JobEvent
from tests.factories import JobAgentFactory, JobFactory
from tests.utils import events_of_kind, run_threads

pytestmark = pytest.mark.django_db(transaction=True)


def assert_grants_match_database(grants):
    for g in grants:
        job = Job.objects.get(id=g.job.id)
        claim = JobClaim.objects.get(job_id=g.job.id)
        assert job.status == states.IN_PROGRESS
        assert job.last_claim_id == g.claim_id == claim.claim_id
        assert job.attempt == g.attempt == claim.attempt == g.job.attempt
        assert claim.claim_expires_at == g.claim_expires_at
        assert job.started_at == g.claimed_at == claim.claimed_at


def test_batch_claim_gives_each_job_its_own_claim_in_claim_order():
    agent = JobAgentFactory(lease_seconds=40)
    low = JobFactory.create_batch(3, job_agent=agent, priority=0)
    high = JobFactory.create_batch(2, job_agent=agent, priority=5)
    JobFactory(job_agent=agent, pending=True)  # never claimable
    grants = lifecycle.claim_next_jobs(agent, 4)
    assert len(grants) == 4
    assert {g.job.id for g in grants[:2]} == {j.id for j in high}
    assert {g.job.id for g in grants[2:]} <= {j.id for j in low}
    assert len({g.claim_id for g in grants}) == 4
    assert all(g.lease_seconds == 40 and g.attempt == 1 for g in grants)
    assert_grants_match_database(grants)
    claimed = events_of_kind(JobEvent.CLAIMED)
    assert sorted((e.job_id, e.claim_id) for e in claimed) == sorted(
        (g.job.id, g.claim_id) for g in grants
    )
    # What is left: one queued job, then nothing.
    rest = lifecycle.claim_next_jobs(agent, 4)
    assert len(rest) == 1 and rest[0].job.id not in {g.job.id for g in grants}
    assert lifecycle.claim_next_jobs(agent, 4) == []


@pytest.mark.parametrize("bad", [0, -1, 101, "2", 2.0, True, None])
def test_limit_is_bounded(bad):
    agent = JobAgentFactory()
    JobFactory(job_agent=agent)
    with pytest.raises(InvalidInput):
        lifecycle.claim_next_jobs(agent, bad)
    assert not JobClaim.objects.exists()


def test_one_write_per_table_whatever_the_batch_size():
    """The batch claim costs the same number of statements for 1 job as for 50."""
    agent = JobAgentFactory()
    JobFactory.create_batch(51, job_agent=agent)
    with CaptureQueriesContext(connection) as one:
        assert len(lifecycle.claim_next_jobs(agent, 1)) == 1
    with CaptureQueriesContext(connection) as fifty:
        grants = lifecycle.claim_next_jobs(agent, 50)
    assert len(grants) == 50
    assert len(fifty.captured_queries) == len(one.captured_queries)
    updates = [q for q in fifty.captured_queries
               if (q["sql"] or "").lstrip().upper().startswith("UPDATE")]
    assert len(updates) <= 1
    assert_grants_match_database(grants)


def test_claim_skips_other_agents_and_terminal_jobs():
    agent = JobAgentFactory()
    other = JobAgentFactory(workspace=agent.workspace)
    mine = JobFactory(job_agent=agent)
    JobFactory.create_batch(3, job_agent=other)
    done = JobFactory(job_agent=agent)
    g = lifecycle.claim_job(agent, done.id)
    lifecycle.report_status(done.id, g.claim_id, states.SUCCESSFUL)
    grants = lifecycle.claim_next_jobs(agent, 10)
    assert [x.job.id for x in grants] == [mine.id]


def test_race_batch_claims_hand_out_each_job_once():
    """Threads, each with its own connection, drain one agent's jobs in batches. Each job
    is handed out exactly once, no call returns more than its limit, and the database has
    exactly one claim per grant (the IN (SELECT ... LIMIT n FOR UPDATE SKIP LOCKED) pitfall
    would show here as extra claimed rows)."""
    agent = JobAgentFactory()
    total, limit = 120, 7
    JobFactory.create_batch(total, job_agent=agent)

    def work(i, barrier):
        barrier.wait()
        mine = []
        while True:
            grants = lifecycle.claim_next_jobs(agent, limit)
            assert len(grants) <= limit
            if not grants:
                # SKIP LOCKED may return nothing while others hold rows: check the table.
                if not Job.objects.filter(job_agent=agent, status=states.QUEUED).exists():
                    return mine
                continue
            mine.extend((g.job.id, g.claim_id) for g in grants)

    results = run_threads(work, 4)
    handed = [item for r in results for item in r]
    assert len(handed) == total
    assert len({job_id for job_id, _ in handed}) == total
    assert Job.objects.filter(status=states.IN_PROGRESS).count() == total
    assert JobClaim.objects.count() == total
    claims = dict(JobClaim.objects.values_list("job_id", "claim_id"))
    assert claims == dict(handed)
    assert set(Job.objects.values_list("attempt", flat=True)) == {1}
    assert len(events_of_kind(JobEvent.CLAIMED)) == total


def test_race_batch_claims_against_cancels_and_single_claims():
    """Batch claimers, single claimers and an operator cancelling race over the same jobs:
    every job ends either claimed once (in_progress with one claim) or cancelled (no
    claim), never both, and no claim is handed out for a cancelled job."""
    agent = JobAgentFactory()
    jobs = JobFactory.create_batch(60, job_agent=agent)

    def work(i, barrier):
        barrier.wait()
        got = []
        if i == 0:
            for j in jobs[::2]:
                lifecycle.cancel_job(j.id)
            return got
        while True:
            grants = (
                lifecycle.claim_next_jobs(agent, 5) if i < 3 else
                [g for g in [lifecycle.claim_next_job(agent)] if g]
            )
            if not grants:
                if not Job.objects.filter(job_agent=agent, status=states.QUEUED).exists():
                    return got
                continue
            got.extend(g.job.id for g in grants)

    results = run_threads(work, 4)
    handed = [job_id for r in results for job_id in r]
    assert len(handed) == len(set(handed))
    statuses = dict(Job.objects.values_list("id", "status"))
    claims = set(JobClaim.objects.values_list("job_id", flat=True))
    for job in jobs:
        if statuses[job.id] == states.IN_PROGRESS:
            assert job.id in claims and job.id in handed
        else:
            assert statuses[job.id] == states.CANCELLED and job.id not in claims
    # A job cancelled after its claim was handed out keeps its timeline honest.
    for job_id in handed:
        if statuses[job_id] == states.CANCELLED:
            kinds = list(
                JobEvent.objects.filter(job_id=job_id).order_by("id").values_list("kind", flat=True)
            )
            assert kinds.index(JobEvent.CLAIMED) < kinds.index(JobEvent.CANCELLED)
