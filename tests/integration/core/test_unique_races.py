"""Unique jobs under racing creates (#30 item 1): N creates with one unique_key make exactly
one job, whatever they race with. Real threads, each with its own connection: on PostgreSQL
the key's advisory lock (unique_key_lock) serializes them; on SQLite BEGIN IMMEDIATE does."""

import datetime as dt

import pytest

from jobqueue import lifecycle, states
from jobqueue.db import db_now
from jobqueue.exceptions import UniqueKeyConflict
from jobqueue.models import Job, JobEvent
from tests.factories import JobAgentFactory
from tests.utils import run_threads

pytestmark = pytest.mark.django_db(transaction=True)

N = 12


def _create(agent, **fields):
    return lifecycle.create_job(workspace=agent.workspace, job_agent=agent,
                                unique_key="nightly", **fields)


def test_racing_creates_with_one_key_make_exactly_one_job():
    agent = JobAgentFactory()

    def create(i, barrier):
        barrier.wait()
        made = _create(agent, dispatch_context={"n": i})
        return made.job.id, made.created, made.deduplicated

    results = run_threads(create, N)
    assert Job.objects.count() == 1
    (job_id,) = {job_id for job_id, _, _ in results}
    assert sorted((created, dedup) for _, created, dedup in results) == (
        [(False, True)] * (N - 1) + [(True, False)])
    assert JobEvent.objects.filter(job_id=job_id, kind=JobEvent.CREATED).count() == 1


def test_racing_replaces_make_one_job_with_one_of_their_contexts():
    agent = JobAgentFactory()

    def create(i, barrier):
        barrier.wait()
        made = _create(agent, dispatch_context={"n": i}, priority=i, on_conflict="replace")
        return made.created

    results = run_threads(create, N)
    assert results.count(True) == 1
    job = Job.objects.get()
    # Each replace wrote context and priority together: the last one's pair.
    assert job.dispatch_context == {"n": job.priority}
    assert job.events.filter(kind=JobEvent.REPLACED).count() == N - 1


@pytest.mark.parametrize("on_conflict", [None, "replace"])
def test_racing_retries_of_one_request_are_replays_not_deduplications(on_conflict):
    """The same Idempotency-Key and unique_key from N retries of one request: one job, and
    every other answer is its replay (the key's lock lets each find the first's job), which
    a retry of a replace does not replace."""
    agent = JobAgentFactory()

    def create(i, barrier):
        barrier.wait()
        made = _create(agent, dispatch_context={"n": 1}, idempotency_key="order-1",
                       on_conflict=on_conflict)
        return made.created, made.deduplicated

    results = run_threads(create, N)
    assert sorted(results) == [(False, False)] * (N - 1) + [(True, False)]
    job = Job.objects.get()
    assert list(job.events.values_list("kind", flat=True)) == [JobEvent.CREATED]


def test_replaces_racing_claims_leave_at_most_one_unclaimed_job():
    """Half the threads replace (or create beside the running job), half claim: whatever the
    order, the key never has two unclaimed live jobs, and a claimed job's context is never
    changed after its claim."""
    agent = JobAgentFactory()
    first = _create(agent, dispatch_context={"n": -1}).job

    def work(i, barrier):
        barrier.wait()
        if i % 2:
            grant = lifecycle.claim_next_job(agent)
            return ("claim", grant and (grant.job.id, grant.job.dispatch_context))
        made = _create(agent, dispatch_context={"n": i}, on_conflict="replace")
        return ("create", made.job.id)

    results = run_threads(work, N)
    live = Job.objects.filter(unique_key="nightly", status__in=states.ACTIVE)
    assert live.filter(status__in=[states.PENDING, states.QUEUED]).count() <= 1
    for kind, value in results:
        if kind == "claim" and value is not None:
            job_id, context = value
            assert Job.objects.get(id=job_id).dispatch_context == context
    assert Job.objects.filter(id=first.id).exists()


def test_racing_debounces_with_mixed_options_never_pass_the_stored_cap():
    """Half the creates send debounce_max_seconds, half not, with several quiet periods: the
    one that made the job decided its cap (or none), and no push went past it."""
    agent = JobAgentFactory()

    def create(i, barrier):
        options = {"debounce_seconds": 30 + 30 * (i % 3)}
        if i % 2:
            options["debounce_max_seconds"] = 120
        barrier.wait()
        made = _create(agent, dispatch_context={"n": i}, **options)
        return made.created, "debounce_max_seconds" in options

    results = run_threads(create, N)
    job = Job.objects.get()
    (capped,) = [has_max for created, has_max in results if created]
    if capped:
        assert job.debounce_until is not None
        assert abs((job.debounce_until - job.created_at).total_seconds() - 120) < 1
        assert job.available_at <= job.debounce_until
    else:
        assert job.debounce_until is None
    assert job.events.filter(kind=JobEvent.REPLACED).count() == N - 1


@pytest.mark.parametrize("expiring", [False, True])
def test_racing_pushes_with_looser_options_stop_at_the_stored_cap(expiring):
    """A job made with a 30 s cap; N racing pushes, each with a longer quiet period and a
    longer max or none: every one is capped at the stored deadline, which none changes. With
    an expires_at 40 s ahead and a 20 s runtime limit, at the last start (expires_at - 20 s)
    instead, the earlier of the two."""
    agent = JobAgentFactory()
    expires = dict(expires_at=db_now() + dt.timedelta(seconds=40),
                   max_runtime_seconds=20) if expiring else {}
    first = _create(agent, debounce_seconds=10, debounce_max_seconds=30, **expires).job
    stored = first.debounce_until
    cap = first.expires_at - dt.timedelta(seconds=20) if expiring else stored

    def push(i, barrier):
        options = {"debounce_seconds": 60 * (1 + i % 3)}
        if i % 2:
            options["debounce_max_seconds"] = 600
        barrier.wait()
        made = _create(agent, dispatch_context={"n": i}, **options)
        return made.deduplicated, made.job.available_at

    results = run_threads(push, N)
    assert all(dedup and at == cap for dedup, at in results)
    job = Job.objects.get()
    assert job.available_at == cap and job.debounce_until == stored


@pytest.mark.parametrize("options", [{"on_conflict": "replace"}, {"debounce_seconds": 30}])
def test_racing_creates_for_two_agents_never_write_into_the_other_agents_job(options):
    """Creates for agents A and B race with one key: one job, of the agent whose create made
    it, whose context is one of that agent's; every create for the other agent is a 409
    unique_key_conflict."""
    a = JobAgentFactory()
    b = JobAgentFactory(workspace=a.workspace)

    def create(i, barrier):
        agent = (a, b)[i % 2]
        barrier.wait()
        try:
            made = lifecycle.create_job(workspace=agent.workspace, job_agent=agent,
                                        unique_key="nightly",
                                        dispatch_context={"agent": agent.name}, **options)
        except UniqueKeyConflict as exc:
            return agent.id, "conflict", exc.context["job_id"]
        return agent.id, made.created, str(made.job.id)

    results = run_threads(create, N)
    job = Job.objects.get()
    assert job.dispatch_context == {"agent": job.job_agent.name}
    for agent_id, outcome, job_id in results:
        assert job_id == str(job.id)
        assert (outcome == "conflict") == (agent_id != job.job_agent_id)
    assert job.events.filter(kind=JobEvent.REPLACED).count() == N // 2 - 1
