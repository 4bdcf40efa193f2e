"""The effect ledger (docs/effects.md): begin answers started / unknown / committed with a
stable effect_id, a commit records the outcome once, effects survive retries, reaps and
requeues, and every bad input or stale claim is refused with nothing recorded."""

import pytest

from jobqueue import lifecycle, states
from jobqueue.db import NowPlusSeconds
from jobqueue.models import Job, JobClaim, JobEffect, JobEvent
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def _claim(world, job):
    r = world.agent_caller().post(f"job-agents/{world.agent.id}/jobs/{job.id}/claim")
    assert r.status_code == 200, r.content
    return r.json()["claim"]["claim_id"]


def _begin(world, job, claim_id, key="charge-card"):
    return world.agent_caller().post(f"jobs/{job.id}/effects/{key}/begin",
                                     json={"claim_id": claim_id})


def _commit(world, job, claim_id, result, key="charge-card"):
    return world.agent_caller().put(f"jobs/{job.id}/effects/{key}",
                                    json={"claim_id": claim_id, "result": result})


def _ledger():
    return sorted(JobEffect.objects.values_list(
        "job_id", "key", "attempt", "claim_id", "earlier_attempt", "result", "committed_at"))


def test_begin_commit_and_begin_again(world):
    job = JobFactory(job_agent=world.agent)
    claim = _claim(world, job)
    r = _begin(world, job, claim)
    assert r.status_code == 201
    started = r.json()
    assert started["state"] == "started" and started["attempt"] == 1
    assert "result" not in started
    again = _begin(world, job, claim)  # a repeat by the same attempt answers the same
    assert again.status_code == 201 and again.json() == started
    r = _commit(world, job, claim, {"charge": "ch_1"})
    assert r.status_code == 200
    assert r.json() == {"state": "committed", "effect_id": started["effect_id"], "attempt": 1,
                        "result": {"charge": "ch_1"}}
    # The same result again: accepted unchanged.
    assert _commit(world, job, claim, {"charge": "ch_1"}).json() == r.json()
    r = _begin(world, job, claim)
    assert r.status_code == 200 and r.json() == {
        "state": "committed", "effect_id": started["effect_id"], "attempt": 1,
        "result": {"charge": "ch_1"}}


def test_a_ledger_holds_at_most_its_cap_of_entries(world, settings):
    # JOBQUEUE_MAX_EFFECTS_PER_JOB: a begin of one more key is 413 and records nothing; the
    # keys already there are answered as always, by this attempt and the next.
    settings.JOBQUEUE = {**settings.JOBQUEUE, "MAX_EFFECTS_PER_JOB": 3}
    job = JobFactory(job_agent=world.agent, max_attempts=3, initial_max_attempts=3)
    claim = _claim(world, job)
    for key in ("a", "b", "c"):
        assert _begin(world, job, claim, key).status_code == 201
    r = _begin(world, job, claim, "d")
    assert r.status_code == 413 and r.json()["code"] == "output_too_large"
    assert "at most 3" in r.json()["detail"]
    assert JobEffect.objects.count() == 3 and not JobEffect.objects.filter(key="d").exists()
    assert _begin(world, job, claim, "a").status_code == 201
    assert _commit(world, job, claim, {"ok": 1}, key="b").status_code == 200
    lifecycle.requeue_job(job.id, actor="test")
    claim = _claim(world, job)
    assert _begin(world, job, claim, "c").json()["state"] == "unknown"
    assert _begin(world, job, claim, "e").status_code == 413
    assert JobEffect.objects.count() == 3


@pytest.mark.parametrize("ending", ["release", "reap", "requeue", "retry"])
def test_an_earlier_attempts_begun_effect_is_unknown_to_the_next(world, ending):
    job = JobFactory(job_agent=world.agent, max_attempts=3, retry_backoff_seconds=1)
    first = _claim(world, job)
    effect_id = _begin(world, job, first).json()["effect_id"]
    _begin(world, job, first, key="email:welcome")
    _commit(world, job, first, "sent", key="email:welcome")
    if ending == "release":
        lifecycle.release_job(job.id, first)
    elif ending == "reap":
        JobClaim.objects.filter(job_id=job.id).update(claim_expires_at=NowPlusSeconds(-5))
        assert lifecycle.reap_expired_claims_once(100).requeued == 1
    elif ending == "retry":
        lifecycle.report_status(job.id, first, states.FAILURE, retry=True)
        Job.objects.filter(id=job.id).update(available_at=NowPlusSeconds(-1))
    else:
        lifecycle.requeue_job(job.id)
    second = _claim(world, job)
    r = _begin(world, job, second)
    assert r.status_code == 200
    assert r.json() == {"state": "unknown", "effect_id": effect_id, "attempt": 1}
    assert _begin(world, job, second).json() == r.json()  # the same, asked again
    # The first attempt's commit now is stale: refused, nothing recorded.
    before = _ledger()
    stale = _commit(world, job, first, "late")
    assert stale.status_code == 409 and stale.json()["code"] == "claim_superseded"
    assert _ledger() == before
    # The committed effect is answered as committed, with the first attempt's result.
    done = _begin(world, job, second, key="email:welcome")
    assert done.json() == {"state": "committed", "effect_id": done.json()["effect_id"],
                           "attempt": 1, "result": "sent"}
    # The new attempt, having reconciled, records the outcome.
    r = _commit(world, job, second, {"charge": "ch_1", "reconciled": True})
    assert r.status_code == 200 and r.json()["attempt"] == 2
    listed = world.producer().get(f"jobs/{job.id}/effects").json()["results"]
    assert [(e["key"], e["state"], e["attempt"], e["earlier_attempt"], e["committed_attempt"])
            for e in listed] == [("charge-card", "committed", 2, 1, 2),
                                 ("email:welcome", "committed", 1, None, 1)]
    assert listed[0]["effect_id"] == effect_id
    assert "claim_id" not in listed[0]


def test_another_result_is_refused(world):
    job = JobFactory(job_agent=world.agent)
    claim = _claim(world, job)
    _begin(world, job, claim)
    _commit(world, job, claim, {"charge": "ch_1"})
    before = _ledger()
    r = _commit(world, job, claim, {"charge": "ch_2"})
    assert r.status_code == 409 and r.json()["code"] == "effect_already_committed"
    assert _ledger() == before


@pytest.mark.parametrize("recorded, other", [
    (1, True), (True, 1), (0, False), (False, 0.0), ([1, True], [1, 1]), ({"ok": True}, {"ok": 1}),
    ("1", 1), (None, False), ([1], [1, None]),
])
def test_another_result_by_json_not_python_equality_is_refused(world, recorded, other):
    """Python's == takes true for 1 (and false for 0): as JSON they are other results."""
    job = JobFactory(job_agent=world.agent)
    claim = _claim(world, job)
    _begin(world, job, claim)
    assert _commit(world, job, claim, recorded).status_code == 200
    before = _ledger()
    r = _commit(world, job, claim, other)
    assert r.status_code == 409 and r.json()["code"] == "effect_already_committed"
    lifecycle.report_status(job.id, claim, states.SUCCESSFUL)
    r = _commit(world, job, claim, other)  # the repeat after the claim ended: the same rule
    assert r.status_code == 409 and r.json()["code"] == "job_finished"
    assert _ledger() == before


@pytest.mark.parametrize("recorded, same", [
    (1, 1.0), (1e20, 10**20), ({"a": 1, "b": [True, None]}, {"b": [True, None], "a": 1.0}),
    (False, False),
])
def test_the_same_result_as_json_is_accepted_again(world, recorded, same):
    """Numbers by value (jsonb reads 1e20 back as an integer: an honest repeat must pass),
    object members in any order; before and after the claim ended."""
    job = JobFactory(job_agent=world.agent)
    claim = _claim(world, job)
    _begin(world, job, claim)
    first = _commit(world, job, claim, recorded).json()
    again = _commit(world, job, claim, same)
    assert again.status_code == 200 and again.json()["effect_id"] == first["effect_id"]
    lifecycle.report_status(job.id, claim, states.SUCCESSFUL)
    assert _commit(world, job, claim, same).status_code == 200


def test_a_commit_without_a_begin_is_refused(world):
    job = JobFactory(job_agent=world.agent, max_attempts=3)
    first = _claim(world, job)
    r = _commit(world, job, first, 1)
    assert r.status_code == 409 and r.json()["code"] == "effect_not_begun"
    assert _ledger() == []
    # Begun by an earlier attempt only: the new attempt must begin it first (and hear unknown).
    _begin(world, job, first)
    lifecycle.release_job(job.id, first)
    second = _claim(world, job)
    before = _ledger()
    r = _commit(world, job, second, 1)
    assert r.status_code == 409 and r.json()["code"] == "effect_not_begun"
    assert _ledger() == before


@pytest.mark.parametrize("key", ["a" * 201, "has space", "semi;colon", "ünicode", "per%25cent",
                                 "star*", ".", ".."])
def test_a_bad_key_is_refused(world, key):
    job = JobFactory(job_agent=world.agent)
    claim = _claim(world, job)
    for r in (_begin(world, job, claim, key=key), _commit(world, job, claim, 1, key=key)):
        assert r.status_code == 400, (key, r.content)
        assert r.json()["code"] == "validation_error" and "key" in r.json()["fields"]
    assert _ledger() == []


def test_the_longest_key_and_every_allowed_character(world):
    job = JobFactory(job_agent=world.agent)
    claim = _claim(world, job)
    for key in ("a" * 200, "Az09._:-"):
        assert _begin(world, job, claim, key=key).status_code == 201
        assert _commit(world, job, claim, None, key=key).status_code == 200
    assert sorted(JobEffect.objects.values_list("key", flat=True)) == ["Az09._:-", "a" * 200]


def test_a_result_over_the_cap_is_refused(world, settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "MAX_RESULT_BYTES": 50}
    job = JobFactory(job_agent=world.agent)
    claim = _claim(world, job)
    _begin(world, job, claim)
    before = _ledger()
    r = _commit(world, job, claim, {"k": "x" * 50})
    assert r.status_code == 400 and "result" in r.json()["fields"]
    assert _ledger() == before
    assert _commit(world, job, claim, {"k": "x" * 40}).status_code == 200


def test_a_stale_claim_is_refused_and_recorded_nothing(world):
    job = JobFactory(job_agent=world.agent)
    first = _claim(world, job)
    lifecycle.release_job(job.id, first)
    second = _claim(world, job)
    r = _begin(world, job, first)
    assert r.status_code == 409 and r.json()["code"] == "claim_superseded"
    assert _ledger() == []
    # The refusal is on the job's timeline, as every stale write's is.
    event = JobEvent.objects.get(job_id=job.id, kind=JobEvent.STALE_WRITE_REFUSED)
    assert event.detail["operation"] == "effect"
    _begin(world, job, second)
    lifecycle.report_status(job.id, second, states.SUCCESSFUL)
    before = _ledger()
    for r in (_begin(world, job, second), _commit(world, job, second, 1)):
        assert r.status_code == 409 and r.json()["code"] == "job_finished"
    assert _ledger() == before


def test_a_job_past_its_deadline_is_refused(world):
    job = JobFactory(job_agent=world.agent, max_runtime_seconds=60)
    claim = _claim(world, job)
    # max_runtime_seconds has passed (the job's guard) and the claim's deadline with it.
    Job.objects.filter(id=job.id).update(started_at=NowPlusSeconds(-120))
    JobClaim.objects.filter(job_id=job.id).update(deadline_at=NowPlusSeconds(-60))
    r = _begin(world, job, claim)
    assert r.status_code == 409 and r.json()["code"] == "deadline_exceeded"
    assert _ledger() == []


def test_effects_are_pruned_with_their_job(world):
    from jobqueue.maintenance import pruner

    job = JobFactory(job_agent=world.agent)
    claim = _claim(world, job)
    _begin(world, job, claim)
    lifecycle.report_status(job.id, claim, states.SUCCESSFUL)
    Job.objects.filter(id=job.id).update(completed_at=NowPlusSeconds(-400 * 86400))
    assert pruner.run_once(older_than_days=1).jobs == 1
    assert _ledger() == []


def test_the_list_needs_the_job(world):
    r = world.producer().get("jobs/00000000-0000-4000-8000-000000000000/effects")
    assert r.status_code == 404
    job = JobFactory(job_agent=world.agent)
    assert world.producer().get(f"jobs/{job.id}/effects").json() == {"results": []}


def test_a_commit_repeated_after_its_claim_ended_is_answered_as_recorded(world):
    """A retry after a lost answer: the committer's own commit, the same result."""
    job = JobFactory(job_agent=world.agent)
    claim = _claim(world, job)
    _begin(world, job, claim)
    first = _commit(world, job, claim, {"charge": "ch_1"}).json()
    lifecycle.report_status(job.id, claim, states.SUCCESSFUL)
    again = _commit(world, job, claim, {"charge": "ch_1"})
    assert again.status_code == 200 and again.json() == first
    before = _ledger()
    other = _commit(world, job, claim, {"charge": "ch_2"})
    assert other.status_code == 409 and other.json()["code"] == "job_finished"
    # Nor another claim's commit of the same result.
    foreign = _commit(world, job, "00000000-0000-4000-8000-000000000000", {"charge": "ch_1"})
    assert foreign.status_code == 409 and foreign.json()["code"] == "job_finished"
    assert _ledger() == before
