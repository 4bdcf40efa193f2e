"""The client library's effect ledger (AgentClient.effect / run_effect / begin_effect,
docs/effects.md) against a real server over HTTP: begin answers started, a commit records the
outcome, a later attempt sees it committed and does not run the body again, an attempt that
crashed between begin and commit leaves `unknown` (with the same effect_id) to the next, and a
stale claim's begin or commit is refused with nothing recorded."""

import pytest
from jobqueue_client import ProducerClient
from jobqueue_client import client as api

from jobqueue import lifecycle, states
from jobqueue.db import NowPlusSeconds
from jobqueue.models import Job, JobClaim, JobEffect
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db(transaction=True)


class Crash(Exception):
    pass


@pytest.fixture
def client(live_world):
    c = api.AgentClient(live_world.base_url, str(live_world.workspace.id),
                        str(live_world.agent.id), live_world.token, holder="test:1")
    yield c
    c.close()


def _job(world):
    return JobFactory(job_agent=world.agent, max_attempts=5, retry_backoff_seconds=1)


def _next_attempt(client, job, claim):
    """End `claim` with a retryable failure and claim the job's next attempt."""
    client.report(claim.job_id, claim.claim_id, "failure", retry=True)
    Job.objects.filter(id=job.id).update(available_at=NowPlusSeconds(-1))
    return client.claim(str(job.id))


def test_begin_commit_and_the_next_attempt_does_not_run_the_body(live_world, client):
    job = _job(live_world)
    claim = client.claim(str(job.id))
    with client.effect(claim, "charge-card") as fx:
        assert (fx.state, fx.attempt, fx.committed, fx.result) == ("started", 1, False, None)
        assert fx.commit({"charge": "ch_1"}) == {"charge": "ch_1"}
        assert (fx.state, fx.committed, fx.result) == ("committed", True, {"charge": "ch_1"})
    effect_id = fx.effect_id
    assert str(JobEffect.objects.get(job_id=job.id, key="charge-card").id) == effect_id
    assert "ch_1" not in repr(fx)
    # The same result again (a resent commit) is accepted; another is refused, unchanged.
    assert fx.commit({"charge": "ch_1"}) == {"charge": "ch_1"}
    with pytest.raises(api.EffectAlreadyCommitted) as refused:
        fx.commit({"charge": "ch_2"})
    assert isinstance(refused.value, api.Conflict) and refused.value.code == (
        "effect_already_committed")

    second = _next_attempt(client, job, claim)
    assert second.attempt == 2
    calls = []
    assert client.run_effect(second, "charge-card", calls.append) == {"charge": "ch_1"}
    assert calls == []  # committed: the body did not run
    with client.effect(second, "charge-card") as fx2:
        assert (fx2.state, fx2.effect_id, fx2.attempt) == ("committed", effect_id, 1)
        assert fx2.result == {"charge": "ch_1"}
    row = JobEffect.objects.get(job_id=job.id, key="charge-card")
    assert (row.committed_attempt, row.result) == (1, {"charge": "ch_1"})


def test_run_effect_commits_what_the_function_returns(live_world, client):
    job = _job(live_world)
    claim = client.claim(str(job.id))
    seen = []

    def send(fx):
        seen.append((fx.state, fx.effect_id))
        return "sent"

    assert client.run_effect(claim, "email:welcome", send) == "sent"
    assert client.run_effect(claim, "email:welcome", send) == "sent"  # not again
    (state, effect_id), = seen
    assert state == "started"
    row = JobEffect.objects.get(job_id=job.id, key="email:welcome")
    assert (str(row.id), row.result, row.committed_attempt) == (effect_id, "sent", 1)
    # null is an outcome too: recorded, and not run again.
    assert client.run_effect(claim, "noop", lambda fx: None) is None
    assert client.run_effect(claim, "noop", lambda fx: pytest.fail("ran again")) is None


def test_a_crashed_attempt_leaves_unknown_with_the_same_effect_id(live_world, client):
    job = _job(live_world)
    first = client.claim(str(job.id))
    with pytest.raises(Crash), client.effect(first, "charge-card") as fx:
        assert fx.state == "started"
        effect_id = fx.effect_id
        raise Crash  # after the outside call, say, before the commit
    row = JobEffect.objects.get(job_id=job.id, key="charge-card")
    assert row.committed_at is None  # nothing committed
    # run_effect's function failing: nothing recorded either.
    with pytest.raises(Crash):
        client.run_effect(first, "email", lambda fx: (_ for _ in ()).throw(Crash()))
    assert JobEffect.objects.get(job_id=job.id, key="email").committed_at is None

    second = _next_attempt(client, job, first)
    seen = []

    def reconcile(fx):
        seen.append((fx.state, fx.effect_id, fx.attempt))
        return {"charge": "ch_found_by_idempotency_key"}

    assert client.run_effect(second, "charge-card", reconcile) == {
        "charge": "ch_found_by_idempotency_key"}
    assert seen == [("unknown", effect_id, 1)]  # the earlier attempt began it
    with client.effect(second, "email") as fx:  # the with form sees unknown too
        assert (fx.state, fx.attempt) == ("unknown", 1)
        fx.commit("sent")
    row = JobEffect.objects.get(job_id=job.id, key="charge-card")
    assert (str(row.id), row.attempt, row.earlier_attempt, row.committed_attempt) == (
        effect_id, 2, 1, 2)
    # The producer reads the ledger (ProducerClient.list_effects).
    with ProducerClient(live_world.base_url, str(live_world.workspace.id),
                        live_world.key) as producer:
        listed = {e["key"]: e for e in producer.list_effects(str(job.id))}
    assert set(listed) == {"charge-card", "email"}
    assert listed["charge-card"] | {"begun_at": None, "committed_at": None} == {
        "effect_id": effect_id, "key": "charge-card", "state": "committed", "attempt": 2,
        "earlier_attempt": 1, "begun_at": None, "committed_attempt": 2, "committed_at": None,
        "result": {"charge": "ch_found_by_idempotency_key"}}


@pytest.mark.parametrize("ending", ["reap", "requeue"])
def test_a_stale_claim_is_refused_and_records_nothing(live_world, client, ending):
    job = _job(live_world)
    first = client.claim(str(job.id))
    fx = client.begin_effect(first.job_id, first.claim_id, "charge-card")
    if ending == "reap":
        JobClaim.objects.filter(job_id=job.id).update(claim_expires_at=NowPlusSeconds(-5))
        assert lifecycle.reap_expired_claims_once(100).requeued == 1
    else:
        lifecycle.requeue_job(job.id)
    with pytest.raises(api.LeaseLost) as refused:
        fx.commit({"charge": "ch_stale"})
    assert refused.value.code == "claim_superseded"
    with pytest.raises(api.LeaseLost):
        client.run_effect(first, "email", lambda fx: pytest.fail("ran for a stale claim"))
    with pytest.raises(api.LeaseLost), client.effect(first, "charge-card"):
        pytest.fail("the block ran for a stale claim")
    assert list(JobEffect.objects.filter(job_id=job.id).values_list(
        "key", "committed_at")) == [("charge-card", None)]
    # The next attempt holds it: unknown, and its commit lands.
    second = client.claim(str(job.id))
    with client.effect(second, "charge-card") as fx2:
        assert (fx2.state, fx2.effect_id) == ("unknown", fx.effect_id)
        fx2.commit({"charge": "ch_ok"})
    assert Job.objects.get(id=job.id).status == states.IN_PROGRESS


def test_a_commit_without_a_begin_and_a_bad_key_are_typed_errors(live_world, client):
    job = _job(live_world)
    claim = client.claim(str(job.id))
    with pytest.raises(api.EffectNotBegun) as refused:
        client.commit_effect(claim.job_id, claim.claim_id, "never-begun", 1)
    assert refused.value.status == 409 and refused.value.code == "effect_not_begun"
    with pytest.raises(api.InvalidRequest) as bad:
        client.begin_effect(claim.job_id, claim.claim_id, "a b")
    assert bad.value.code == "validation_error"
    assert not JobEffect.objects.filter(job_id=job.id).exists()
