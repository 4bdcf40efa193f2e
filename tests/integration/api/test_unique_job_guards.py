"""What a unique key's later creates may not do to the live job (#30 item 1, the review's
gaps; docs/api.md "Unique jobs and debounce"): push a debounced job past the cap its first
create stored (whatever their own options), write into a job of another job agent (409
unique_key_conflict, nothing changed), or push a job so late that it cannot run before its
expires_at."""

import datetime as dt

import pytest
from django.db.models import F

from jobqueue import states
from jobqueue.db import db_now
from jobqueue.models import Job, JobEvent


def _body(world, key="nightly", agent=None, **extra):
    return {"job_agent_id": str((agent or world.agent).id), "dispatch_context": {"n": 1},
            "unique_key": key, **extra}


def _claim(world):
    return world.agent_caller().post(f"job-agents/{world.agent.id}/jobs/claim")


def _age(job_id, seconds):
    """As if `seconds` had passed since the job was created (its stored times moved)."""
    delta = dt.timedelta(seconds=seconds)
    Job.objects.filter(id=job_id).update(
        created_at=F("created_at") - delta, available_at=F("available_at") - delta,
        debounce_until=F("debounce_until") - delta, expires_at=F("expires_at") - delta)


def _at(text):
    return dt.datetime.fromisoformat(text)


# --- the debounce cap is the job's -------------------------------------------------------


def test_the_first_debounced_create_stores_its_cap_and_no_other_create_does(world):
    producer = world.producer()
    capped = producer.post("jobs", json=_body(world, debounce_seconds=60,
                                              debounce_max_seconds=600)).json()
    job = Job.objects.get(id=capped["id"])
    assert dt.timedelta(seconds=599) <= job.debounce_until - job.created_at \
        <= dt.timedelta(seconds=601)
    # Internal: the representation does not show it.
    assert "debounce_until" not in capped
    assert "debounce_until" not in producer.get(f"jobs/{capped['id']}").json()
    # Without a max, a plain keyed job, a plain job: no cap.
    uncapped = producer.post("jobs", json=_body(world, key="b", debounce_seconds=60)).json()
    keyed = producer.post("jobs", json=_body(world, key="c")).json()
    plain = producer.post("jobs", json={"job_agent_id": str(world.agent.id)}).json()
    for made in (uncapped, keyed, plain):
        assert Job.objects.get(id=made["id"]).debounce_until is None


@pytest.mark.parametrize("later", [
    {"debounce_seconds": 60},  # no max at all
    {"debounce_seconds": 60, "debounce_max_seconds": 7 * 86_400},  # a longer max
    {"debounce_seconds": 3600},  # a longer quiet period
])
def test_a_later_create_cannot_push_past_the_stored_cap_whatever_its_options(world, later):
    producer = world.producer()
    first = producer.post("jobs", json=_body(world, debounce_seconds=60,
                                             debounce_max_seconds=120)).json()
    cap = Job.objects.get().debounce_until
    _age(first["id"], 100)
    cap -= dt.timedelta(seconds=100)
    pushed = producer.post("jobs", json=_body(world, dispatch_context={"n": 2}, **later))
    assert pushed.status_code == 200 and pushed.json()["deduplicated"] is True
    job = Job.objects.get()
    assert job.available_at == cap and job.debounce_until == cap  # the cap is unchanged
    assert _at(pushed.json()["available_at"]) == cap
    # At the max it runs, with the last context (a create still gives it its context).
    _age(first["id"], 21)
    producer.post("jobs", json=_body(world, dispatch_context={"n": 3}, **later))
    grant = _claim(world)
    assert grant.status_code == 200, grant.content
    assert grant.json()["job"]["dispatch_context"] == {"n": 3}
    assert Job.objects.count() == 1


def test_a_later_max_does_not_cap_a_job_made_without_one(world):
    """The cap is the first create's: a job made without debounce_max_seconds keeps none."""
    producer = world.producer()
    first = producer.post("jobs", json=_body(world, debounce_seconds=60)).json()
    _age(first["id"], 500)
    pushed = producer.post("jobs", json=_body(world, debounce_seconds=60,
                                              debounce_max_seconds=120)).json()
    now = db_now()
    assert now + dt.timedelta(seconds=55) < _at(pushed["available_at"]) \
        <= now + dt.timedelta(seconds=60)
    assert Job.objects.get().debounce_until is None


def test_a_replace_of_a_debounced_job_stays_within_its_cap(world):
    producer = world.producer()
    producer.post("jobs", json=_body(world, debounce_seconds=60, debounce_max_seconds=120))
    cap = Job.objects.get().debounce_until
    r = producer.post("jobs", json=_body(world, on_conflict="replace", delay_seconds=3600,
                                         dispatch_context={"n": 2}))
    assert r.status_code == 200 and r.json()["deduplicated"] is True
    assert Job.objects.get().available_at == cap
    # A replace may still move it earlier (now, without a delay).
    r = producer.post("jobs", json=_body(world, on_conflict="replace"))
    assert _at(r.json()["available_at"]) <= db_now()


# --- never into another agent's job --------------------------------------------------------


def _snapshot(job_id):
    job = Job.objects.get(id=job_id)
    return (job.status, job.dispatch_context, job.priority, job.available_at, job.updated_at,
            job.job_agent_id, job.events.count())


@pytest.mark.parametrize("options", [
    {"on_conflict": "replace"},
    {"debounce_seconds": 5},
    {"debounce_seconds": 5, "debounce_max_seconds": 10, "on_conflict": "replace"},
])
@pytest.mark.parametrize("status", [states.QUEUED, states.PENDING, states.IN_PROGRESS])
def test_a_replace_or_debounce_for_another_agent_is_a_409_and_changes_nothing(
        world, options, status):
    producer = world.producer()
    first = producer.post("jobs", json=_body(world, hold=status == states.PENDING,
                                             dispatch_context={"secret": "a"})).json()
    if status == states.IN_PROGRESS:
        assert _claim(world).status_code == 200
    before = _snapshot(first["id"])
    r = producer.post("jobs", json=_body(world, agent=world.other_agent, priority=9,
                                         dispatch_context={"secret": "b"}, **options))
    assert r.status_code == 409, r.content
    body = r.json()
    assert body["code"] == "unique_key_conflict"
    assert first["id"] in body["detail"] and "another job agent" in body["detail"]
    assert _snapshot(first["id"]) == before
    assert Job.objects.count() == 1


def test_a_refused_create_records_nothing_under_its_idempotency_key(world):
    producer = world.producer()
    first = producer.post("jobs", json=_body(world)).json()
    body = _body(world, agent=world.other_agent, on_conflict="replace")
    for _ in range(2):  # the retry meets the same job again
        r = producer.post("jobs", json=body, headers={"Idempotency-Key": "k"})
        assert r.status_code == 409 and r.json()["code"] == "unique_key_conflict"
    assert not Job.objects.filter(idempotency_key="k").exists()
    # Once the live job has ended, the retry creates its job.
    assert producer.post(f"jobs/{first['id']}/cancel").status_code == 200
    r = producer.post("jobs", json=body, headers={"Idempotency-Key": "k"})
    assert r.status_code == 201 and r.json()["job_agent_id"] == str(world.other_agent.id)


def test_a_skip_for_another_agent_is_still_the_deduplicated_answer(world):
    """Skipping changes nothing: the key is the workspace's, whatever the agent."""
    producer = world.producer()
    first = producer.post("jobs", json=_body(world)).json()
    for options in ({}, {"on_conflict": "skip"}):
        r = producer.post("jobs", json=_body(world, agent=world.other_agent, **options))
        assert r.status_code == 200 and r.json()["deduplicated"] is True
        assert r.json()["id"] == first["id"]
        assert r.json()["job_agent_id"] == str(world.agent.id)
    assert Job.objects.get().dispatch_context == {"n": 1}


def test_the_same_agent_still_replaces_and_debounces(world):
    producer = world.producer()
    other = producer.post("jobs", json=_body(world, agent=world.other_agent)).json()
    r = producer.post("jobs", json=_body(world, agent=world.other_agent, on_conflict="replace",
                                         dispatch_context={"n": 2}))
    assert r.status_code == 200 and r.json()["id"] == other["id"]
    r = producer.post("jobs", json=_body(world, agent=world.other_agent, debounce_seconds=5,
                                         dispatch_context={"n": 3}))
    assert r.status_code == 200 and r.json()["id"] == other["id"]
    assert Job.objects.get().dispatch_context == {"n": 3}


# --- never past expires_at ---------------------------------------------------------------


def _expiring(world, seconds, **extra):
    expires = (db_now() + dt.timedelta(seconds=seconds)).isoformat()
    return _body(world, expires_at=expires, **extra)


def test_a_push_stops_a_quiet_period_before_expires_at(world):
    producer = world.producer()
    first = producer.post("jobs", json=_expiring(world, 600, debounce_seconds=60)).json()
    expires = _at(first["expires_at"])
    _age(first["id"], 520)  # 80 s left: now + 60 would leave 20 s
    expires -= dt.timedelta(seconds=520)
    pushed = producer.post("jobs", json=_body(world, debounce_seconds=60,
                                              dispatch_context={"n": 2}))
    assert pushed.status_code == 200, pushed.content
    assert _at(pushed.json()["available_at"]) == expires - dt.timedelta(seconds=60)
    # Once there, it is claimed and runs, before it expires.
    _age(first["id"], 21)
    grant = _claim(world)
    assert grant.status_code == 200, grant.content
    assert grant.json()["job"]["dispatch_context"] == {"n": 2}


def test_a_push_leaves_a_job_with_a_runtime_limit_its_whole_runtime(world):
    producer = world.producer()
    first = producer.post("jobs", json=_expiring(world, 600, debounce_seconds=60,
                                                 max_runtime_seconds=120)).json()
    _age(first["id"], 450)  # 150 s left: a push may go to 30 s from now at most
    expires = _at(first["expires_at"]) - dt.timedelta(seconds=450)
    pushed = producer.post("jobs", json=_body(world, debounce_seconds=60)).json()
    assert _at(pushed["available_at"]) == expires - dt.timedelta(seconds=120)


def test_a_push_after_the_last_start_leaves_the_job_claimable(world):
    producer = world.producer()
    first = producer.post("jobs", json=_expiring(world, 600, debounce_seconds=60)).json()
    _age(first["id"], 570)  # 30 s left: the last start (expires - 60) has passed
    expires = _at(first["expires_at"]) - dt.timedelta(seconds=570)
    pushed = producer.post("jobs", json=_body(world, debounce_seconds=60,
                                              dispatch_context={"n": 2}))
    assert pushed.status_code == 200
    job = Job.objects.get()
    assert job.available_at == expires - dt.timedelta(seconds=60) < db_now()
    assert job.events.filter(kind=JobEvent.REPLACED).count() == 1
    grant = _claim(world)
    assert grant.status_code == 200 and grant.json()["job"]["dispatch_context"] == {"n": 2}


def test_a_push_never_moves_a_job_earlier_than_its_own_delay(world):
    """The producer's own delay_seconds may pass the last start; a push keeps it."""
    producer = world.producer()
    first = producer.post("jobs", json=_expiring(world, 600, delay_seconds=3600)).json()
    pushed = producer.post("jobs", json=_body(world, debounce_seconds=60)).json()
    assert pushed["available_at"] == first["available_at"]


def test_the_first_create_waits_no_later_than_the_last_start(world):
    producer = world.producer()
    made = producer.post("jobs", json=_expiring(world, 90, debounce_seconds=60)).json()
    now = db_now()
    available = _at(made["available_at"])
    assert available <= _at(made["expires_at"]) - dt.timedelta(seconds=60)
    assert now + dt.timedelta(seconds=25) < available <= now + dt.timedelta(seconds=30)
    # So close to expiry that no quiet period fits: claimable at once.
    made = producer.post("jobs", json=_expiring(world, 30, key="soon",
                                                debounce_seconds=60)).json()
    assert _at(made["available_at"]) <= db_now()
