"""The effect ledger under racing attempts (lifecycle/effects.py): real threads, each with its
own database connection. A stale attempt and the current one beginning and committing one key
together leave exactly one commit; a commit racing the claim's end lands before it (and the
next attempt hears `committed`) or is refused (and the next attempt hears `unknown` and
commits its own); the claim's end waits for a commit in flight (PostgreSQL: the claim row
is held FOR SHARE by claim_hold_if_current)."""

import threading
import time

import pytest
from django.db import connection, transaction

from jobqueue import lifecycle
from jobqueue.exceptions import (
    ClaimSuperseded,
    EffectAlreadyCommitted,
    JobFinished,
    OutputTooLarge,
)
from jobqueue.lifecycle import effects
from jobqueue.models import JobEffect
from tests.factories import JobAgentFactory, JobFactory
from tests.utils import run_threads

pytestmark = pytest.mark.django_db(transaction=True)

ROUNDS = 25


def _handed_over(agent):
    """A job claimed by attempt 1, requeued and claimed by attempt 2: (job_id, stale claim,
    current claim)."""
    job = JobFactory(job_agent=agent)
    stale = lifecycle.claim_job(agent, job.id).claim_id
    lifecycle.requeue_job(job.id)
    current = lifecycle.claim_job(agent, job.id).claim_id
    return job.id, stale, current


def test_a_stale_and_the_current_attempt_begin_and_commit_one_key_together():
    agent = JobAgentFactory()
    jobs = [_handed_over(agent) for _ in range(ROUNDS)]

    def attempt(i, barrier):
        outcomes = []
        for job_id, stale, current in jobs:
            claim_id = (stale, current)[i]
            barrier.wait()
            try:
                answer = effects.begin_effect(job_id, claim_id, "charge")
                effects.commit_effect(job_id, claim_id, "charge", {"by": i})
                outcomes.append(answer.state)
            except ClaimSuperseded:
                outcomes.append("refused")
        return outcomes

    stale_outcomes, current_outcomes = run_threads(attempt, 2)
    assert set(stale_outcomes) == {"refused"}
    assert set(current_outcomes) == {"started"}
    rows = list(JobEffect.objects.values_list("job_id", "committed_attempt", "result"))
    assert sorted(rows) == sorted((job_id, 2, {"by": 1}) for job_id, _, _ in jobs)


def test_a_commit_racing_the_claims_end_lands_before_it_or_not_at_all():
    agent = JobAgentFactory()
    jobs = []
    for _ in range(ROUNDS):
        job = JobFactory(job_agent=agent)
        first = lifecycle.claim_job(agent, job.id).claim_id
        assert effects.begin_effect(job.id, first, "charge").state == effects.STARTED
        jobs.append((job.id, first))

    def racer(i, barrier):
        outcomes = []
        for job_id, first in jobs:
            barrier.wait()
            if i == 0:  # the first attempt commits what it did
                try:
                    effects.commit_effect(job_id, first, "charge", "first")
                    outcomes.append("committed")
                except ClaimSuperseded:
                    outcomes.append("refused")
            else:  # the operator requeues; the next attempt begins and, if unknown, commits
                lifecycle.requeue_job(job_id)
                me = type(agent).objects.get(id=agent.id)
                second = lifecycle.claim_job(me, job_id).claim_id
                answer = effects.begin_effect(job_id, second, "charge")
                if answer.state == effects.UNKNOWN:
                    assert answer.attempt == 1
                    effects.commit_effect(job_id, second, "charge", "second")
                outcomes.append(answer.state)
        return outcomes

    firsts, seconds = run_threads(racer, 2)
    rows = dict((job_id, (attempt, result)) for job_id, attempt, result in
                JobEffect.objects.values_list("job_id", "committed_attempt", "result"))
    assert len(rows) == ROUNDS
    for (job_id, _), first, second in zip(jobs, firsts, seconds, strict=True):
        if first == "committed":  # it landed while its claim was current
            assert second == effects.COMMITTED and rows[job_id] == (1, "first")
        else:
            assert second == effects.UNKNOWN and rows[job_id] == (2, "second")


def test_one_attempts_racing_begins_and_commits_of_one_key_take_turns():
    """An agent's retries overlapping its first calls: every begin answers started, one row;
    one commit is recorded, the others (another result each) are told it is."""
    agent = JobAgentFactory()
    job = JobFactory(job_agent=agent)
    claim = lifecycle.claim_job(agent, job.id).claim_id

    def holder(i, barrier):
        barrier.wait()
        answer = effects.begin_effect(job.id, claim, "charge")
        barrier.wait()
        try:
            effects.commit_effect(job.id, claim, "charge", {"by": i})
            return answer.state, "committed"
        except EffectAlreadyCommitted:
            return answer.state, "refused"

    outcomes = run_threads(holder, 6)
    assert {state for state, _ in outcomes} == {effects.STARTED}
    assert sorted(done for _, done in outcomes) == ["committed"] + ["refused"] * 5
    winner = next(i for i, (_, done) in enumerate(outcomes) if done == "committed")
    assert list(JobEffect.objects.values_list("result", flat=True)) == [{"by": winner}]


def _until(condition, bound=30.0):
    """Poll `condition` until it holds (a bound, not a measurement: past it, the test fails)."""
    end = time.monotonic() + bound
    while not condition():
        assert time.monotonic() < end, "the condition never held"
        time.sleep(0.01)


def _waits_on_a_lock(pid) -> bool:
    with connection.cursor() as cursor:  # pg_locks is read live, even inside a transaction
        cursor.execute("SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = %s AND NOT granted)",
                       [pid])
        return cursor.fetchone()[0]


@pytest.mark.postgres_only
def test_the_claims_end_waits_for_an_effect_commit_in_flight():
    """A commit whose transaction is still open holds the claim: a requeue waits for it, and
    the next attempt hears `committed` (without the hold it would requeue at once, and the
    next attempt would hear `unknown` and do the effect again)."""
    agent = JobAgentFactory()
    job = JobFactory(job_agent=agent)
    first = lifecycle.claim_job(agent, job.id).claim_id
    effects.begin_effect(job.id, first, "charge")
    pids, committed, requeued = {}, threading.Event(), threading.Event()

    def racer(i, barrier):
        if i == 0:
            with transaction.atomic():
                effects.commit_effect(job.id, first, "charge", "first")
                barrier.wait()
                _until(lambda: requeued.is_set() or _waits_on_a_lock(pids[1]))
                committed.set()
            return None
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            pids[1] = cursor.fetchone()[0]
        barrier.wait()
        lifecycle.requeue_job(job.id)
        requeued.set()
        was_committed = committed.is_set()
        me = type(agent).objects.get(id=agent.id)
        second = lifecycle.claim_job(me, job.id).claim_id
        return was_committed, effects.begin_effect(job.id, second, "charge")

    _, (was_committed, answer) = run_threads(racer, 2)
    assert was_committed, "the requeue ended the claim while its effect commit was open"
    assert (answer.state, answer.attempt, answer.result) == (effects.COMMITTED, 1, "first")


def test_racing_begins_of_new_keys_never_pass_the_ledgers_cap(settings):
    """JOBQUEUE_MAX_EFFECTS_PER_JOB is counted under the job row's lock: of 8 begins of 8
    new keys at once by the current attempt, exactly the cap's worth are started."""
    settings.JOBQUEUE = {**settings.JOBQUEUE, "MAX_EFFECTS_PER_JOB": 3}
    agent = JobAgentFactory()
    jobs = [JobFactory(job_agent=agent) for _ in range(5)]
    claims = [lifecycle.claim_job(agent, job.id).claim_id for job in jobs]

    def begin(i, barrier):
        outcomes = []
        for job, claim_id in zip(jobs, claims, strict=True):
            barrier.wait()
            try:
                outcomes.append(effects.begin_effect(job.id, claim_id, f"key-{i}").state)
            except OutputTooLarge:
                outcomes.append("full")
        return outcomes

    results = run_threads(begin, 8)
    for n in range(len(jobs)):
        assert sorted(r[n] for r in results) == ["full"] * 5 + ["started"] * 3
        assert JobEffect.objects.filter(job_id=jobs[n].id).count() == 3


def test_a_begin_of_a_new_key_racing_the_claims_end_never_deadlocks():
    """The cap's lock is the ledger's own (an advisory lock), not the job row's: a begin
    holds its claim row, and a report ends the claim by locking the job row and then the
    claim row. Each race ends with the report taken and the begin before it or refused."""
    agent = JobAgentFactory()
    jobs = [JobFactory(job_agent=agent) for _ in range(ROUNDS)]
    claims = [lifecycle.claim_job(agent, job.id).claim_id for job in jobs]

    def race(i, barrier):
        outcomes = []
        for job, claim_id in zip(jobs, claims, strict=True):
            barrier.wait()
            if i == 0:
                try:
                    outcomes.append(effects.begin_effect(job.id, claim_id, "charge").state)
                except (ClaimSuperseded, JobFinished):
                    outcomes.append("refused")
            else:
                lifecycle.report_status(job.id, claim_id, "successful")
                outcomes.append("reported")
        return outcomes

    begins, reports = run_threads(race, 2)
    assert set(reports) == {"reported"} and set(begins) <= {"started", "refused"}
    assert JobEffect.objects.count() == begins.count("started")
