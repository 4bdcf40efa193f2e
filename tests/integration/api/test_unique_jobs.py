"""Unique jobs and debounce on POST jobs (#30 item 1; docs/api.md "Unique jobs and
debounce"): a live job with the key is answered (200, deduplicated) instead of a new one,
replaced or debounced in place as the create says; a create without a key is unchanged."""

import datetime as dt

import pytest
from django.db.models import F

from jobqueue import states
from jobqueue.db import db_now
from jobqueue.models import Job, JobEvent


def _body(world, key="nightly", **extra):
    body = {"job_agent_id": str(world.agent.id), "dispatch_context": {"n": 1}, **extra}
    if key is not None:
        body["unique_key"] = key
    return body


def _claim(world):
    return world.agent_caller().post(f"job-agents/{world.agent.id}/jobs/claim")


def _age(job_id, seconds):
    """As if `seconds` had passed since the job was created (the database's times moved)."""
    delta = dt.timedelta(seconds=seconds)
    Job.objects.filter(id=job_id).update(created_at=F("created_at") - delta,
                                         available_at=F("available_at") - delta,
                                         debounce_until=F("debounce_until") - delta,
                                         expires_at=F("expires_at") - delta)


def test_a_create_without_a_key_says_it_was_not_deduplicated(world):
    r = world.producer().post("jobs", json=_body(world, key=None))
    assert r.status_code == 201, r.content
    assert r.json()["deduplicated"] is False
    assert r.json()["unique_key"] is None


def test_a_second_create_with_the_key_answers_the_live_job(world):
    producer = world.producer()
    first = producer.post("jobs", json=_body(world))
    assert first.status_code == 201, first.content
    assert first.json()["deduplicated"] is False
    assert first.json()["unique_key"] == "nightly"
    second = producer.post("jobs", json=_body(world, dispatch_context={"n": 2}, priority=5))
    assert second.status_code == 200, second.content
    assert second.json()["deduplicated"] is True
    assert second.json()["id"] == first.json()["id"]
    job = Job.objects.get()
    assert job.dispatch_context == {"n": 1} and job.priority == 0  # skip: unchanged
    # Another key is another job; so is the same key in another workspace.
    assert producer.post("jobs", json=_body(world, key="other")).status_code == 201
    foreign = {"job_agent_id": str(world.other_workspace_agent.id), "unique_key": "nightly"}
    caller = world.producer().with_headers({"X-API-Key": world.other_key})
    caller.workspace_id = world.other_workspace.id
    assert caller.post("jobs", json=foreign).status_code == 201
    assert Job.objects.count() == 3


@pytest.mark.parametrize("status", [states.PENDING, states.IN_PROGRESS])
def test_every_live_status_counts_by_default(world, status):
    producer = world.producer()
    first = producer.post("jobs", json=_body(world, hold=status == states.PENDING)).json()
    if status == states.IN_PROGRESS:
        assert _claim(world).json()["job"]["id"] == first["id"]
    again = producer.post("jobs", json=_body(world))
    assert again.status_code == 200 and again.json()["id"] == first["id"]
    assert again.json()["status"] == status and again.json()["deduplicated"] is True


@pytest.mark.parametrize("end", ["successful", "cancelled"])
def test_a_finished_job_does_not_count(world, end):
    producer = world.producer()
    first = producer.post("jobs", json=_body(world)).json()
    if end == "cancelled":
        assert producer.post(f"jobs/{first['id']}/cancel").status_code == 200
    else:
        claim = _claim(world).json()["claim"]
        assert world.agent_caller().put(f"jobs/{first['id']}/status", json={
            "status": "successful", "claim_id": claim["claim_id"]}).status_code == 200
    again = producer.post("jobs", json=_body(world))
    assert again.status_code == 201 and again.json()["id"] != first["id"]
    assert again.json()["deduplicated"] is False


def test_unique_states_narrow_what_counts_as_live(world):
    producer = world.producer()
    first = producer.post("jobs", json=_body(world)).json()
    assert _claim(world).status_code == 200  # first is in_progress
    queued_only = producer.post("jobs", json=_body(world, unique_states=["queued"]))
    assert queued_only.status_code == 201, queued_only.content
    second = queued_only.json()
    # The next create finds the queued one first (an unclaimed one comes first), whatever
    # the in_progress one.
    again = producer.post("jobs", json=_body(world, unique_states=["queued", "in_progress"]))
    assert again.status_code == 200 and again.json()["id"] == second["id"]
    running = producer.post("jobs", json=_body(world, unique_states=["in_progress"]))
    assert running.status_code == 200 and running.json()["id"] == first["id"]
    assert Job.objects.count() == 2


def test_replace_updates_an_unclaimed_job_in_place(world):
    producer = world.producer()
    first = producer.post("jobs", json=_body(world, dispatch_context={"token": "old-secret"},
                                             delay_seconds=3600)).json()
    r = producer.post("jobs", json=_body(world, on_conflict="replace", priority=7,
                                         dispatch_context={"token": "new-secret"}))
    assert r.status_code == 200, r.content
    body = r.json()
    assert body["deduplicated"] is True and body["id"] == first["id"]
    assert body["priority"] == 7
    assert body["available_at"] < first["available_at"]  # now, no longer an hour ahead
    job = Job.objects.get()
    assert job.dispatch_context == {"token": "new-secret"}
    assert "secret" not in r.text
    # The timeline says so, without the context; the claim carries the new one.
    detail = producer.get(f"jobs/{first['id']}")
    kinds = [e["kind"] for e in detail.json()["events"]]
    assert kinds == [JobEvent.CREATED, JobEvent.REPLACED]
    assert "secret" not in detail.text
    assert "secret" not in producer.get("jobs").text
    assert _claim(world).json()["job"]["dispatch_context"] == {"token": "new-secret"}


def test_replace_keeps_a_pending_job_pending(world):
    producer = world.producer()
    first = producer.post("jobs", json=_body(world, hold=True)).json()
    r = producer.post("jobs", json=_body(world, on_conflict="replace",
                                         dispatch_context={"n": 2}, delay_seconds=60))
    assert r.status_code == 200 and r.json()["id"] == first["id"]
    assert r.json()["status"] == states.PENDING
    assert Job.objects.get().dispatch_context == {"n": 2}


def test_replace_beside_an_in_progress_job_creates_a_new_one(world):
    producer = world.producer()
    first = producer.post("jobs", json=_body(world)).json()
    assert _claim(world).status_code == 200
    r = producer.post("jobs", json=_body(world, on_conflict="replace",
                                         dispatch_context={"n": 2}))
    assert r.status_code == 201, r.content
    assert r.json()["id"] != first["id"] and r.json()["deduplicated"] is False
    # The running one is untouched; the next replace updates the new, unclaimed one.
    assert Job.objects.get(id=first["id"]).dispatch_context == {"n": 1}
    again = producer.post("jobs", json=_body(world, on_conflict="replace",
                                             dispatch_context={"n": 3}))
    assert again.status_code == 200 and again.json()["id"] == r.json()["id"]
    assert Job.objects.get(id=r.json()["id"]).dispatch_context == {"n": 3}


def test_the_idempotency_key_keeps_its_meaning_beside_the_unique_key(world):
    producer = world.producer()
    first = producer.post("jobs", json=_body(world), headers={"Idempotency-Key": "k1"})
    assert first.status_code == 201
    # A retry of that request: its own job, a replay (not a deduplication).
    replay = producer.post("jobs", json=_body(world), headers={"Idempotency-Key": "k1"})
    assert replay.status_code == 200 and replay.json()["id"] == first.json()["id"]
    assert replay.json()["deduplicated"] is False
    # Another request (another key) with the unique key: deduplicated.
    other = producer.post("jobs", json=_body(world), headers={"Idempotency-Key": "k2"})
    assert other.status_code == 200 and other.json()["deduplicated"] is True
    assert other.json()["id"] == first.json()["id"]
    # The idempotency key with another body (another unique key, or other options) is 422.
    for changed in (_body(world, key="else"), _body(world, on_conflict="skip")):
        reuse = producer.post("jobs", json=changed, headers={"Idempotency-Key": "k1"})
        assert reuse.status_code == 422, reuse.content
        assert reuse.json()["code"] == "idempotency_key_reused"
    assert Job.objects.count() == 1


def test_a_debounced_job_runs_once_with_the_last_context_after_the_quiet_period(world):
    producer = world.producer()
    debounce = {"debounce_seconds": 60}
    first = producer.post("jobs", json=_body(world, **debounce)).json()
    now = db_now()
    available = dt.datetime.fromisoformat(first["available_at"])
    # The first create waits the quiet period too.
    assert now + dt.timedelta(seconds=55) < available <= now + dt.timedelta(seconds=60)
    _age(first["id"], 30)
    pushed = producer.post("jobs", json=_body(world, dispatch_context={"n": 2}, **debounce))
    assert pushed.status_code == 200 and pushed.json()["deduplicated"] is True
    until = dt.datetime.fromisoformat(pushed.json()["available_at"])
    now = db_now()
    assert now + dt.timedelta(seconds=55) < until <= now + dt.timedelta(seconds=60)
    assert _claim(world).status_code == 204  # still quiet
    _age(first["id"], 61)
    grant = _claim(world)
    assert grant.status_code == 200
    assert grant.json()["job"]["dispatch_context"] == {"n": 2}
    assert Job.objects.count() == 1
    events = list(JobEvent.objects.filter(job_id=first["id"]).values_list("kind", "detail"))
    assert (JobEvent.REPLACED, {"debounced": True}) in events


def test_debounce_pushes_no_further_than_its_max_after_the_first_create(world):
    producer = world.producer()
    debounce = {"debounce_seconds": 60, "debounce_max_seconds": 120}
    first = producer.post("jobs", json=_body(world, **debounce)).json()
    _age(first["id"], 100)
    capped = producer.post("jobs", json=_body(world, dispatch_context={"n": 2}, **debounce))
    job = Job.objects.get()
    assert job.available_at == job.created_at + dt.timedelta(seconds=120)
    assert capped.json()["available_at"] == job.available_at.isoformat().replace("+00:00", "Z")
    _age(first["id"], 30)  # past the max: a create still gives its context, and it runs
    producer.post("jobs", json=_body(world, dispatch_context={"n": 3}, **debounce))
    grant = _claim(world)
    assert grant.status_code == 200, grant.content
    assert grant.json()["job"]["dispatch_context"] == {"n": 3}


def test_a_push_never_moves_a_job_earlier(world):
    producer = world.producer()
    first = producer.post("jobs", json=_body(world, delay_seconds=3600)).json()
    again = producer.post("jobs", json=_body(world, debounce_seconds=5,
                                             dispatch_context={"n": 2}))
    assert again.status_code == 200
    assert again.json()["available_at"] == first["available_at"]
    assert Job.objects.get().dispatch_context == {"n": 2}


def test_debounce_leaves_a_claimed_or_pending_job_alone(world):
    producer = world.producer()
    held = producer.post("jobs", json=_body(world, hold=True)).json()
    r = producer.post("jobs", json=_body(world, debounce_seconds=5, dispatch_context={"n": 2}))
    assert r.status_code == 200 and r.json()["id"] == held["id"]
    assert r.json()["available_at"] == held["available_at"]
    assert Job.objects.get().dispatch_context == {"n": 1}
    assert producer.post(f"jobs/{held['id']}/dispatch").status_code == 200
    assert _claim(world).status_code == 200
    r = producer.post("jobs", json=_body(world, debounce_seconds=5, dispatch_context={"n": 3}))
    assert r.status_code == 200 and r.json()["status"] == states.IN_PROGRESS
    assert Job.objects.get().dispatch_context == {"n": 1}


@pytest.mark.parametrize(("extra", "field"), [
    ({"unique_key": None, "debounce_seconds": 5}, "debounce_seconds"),
    ({"unique_key": None, "unique_states": ["queued"]}, "unique_states"),
    ({"unique_key": None, "on_conflict": "replace"}, "on_conflict"),
    ({"unique_key": None, "debounce_max_seconds": 5}, "debounce_max_seconds"),
    ({"unique_key": ""}, "unique_key"),
    ({"unique_key": "x" * 256}, "unique_key"),
    ({"unique_key": "tab\there"}, "unique_key"),
    ({"unique_key": 7}, "unique_key"),
    ({"on_conflict": "merge"}, "on_conflict"),
    ({"unique_states": []}, "unique_states"),
    ({"unique_states": ["successful"]}, "unique_states"),
    ({"unique_states": "queued"}, "unique_states"),
    ({"debounce_seconds": 0}, "debounce_seconds"),
    ({"debounce_seconds": 86_401}, "debounce_seconds"),
    ({"debounce_seconds": "5"}, "debounce_seconds"),
    ({"debounce_seconds": 5, "unique_states": ["pending", "in_progress"]}, "debounce_seconds"),
    ({"debounce_max_seconds": 60}, "debounce_max_seconds"),
    ({"debounce_seconds": 60, "debounce_max_seconds": 59}, "debounce_max_seconds"),
    ({"debounce_seconds": 60, "debounce_max_seconds": 7 * 86_400 + 1}, "debounce_max_seconds"),
])
def test_bad_unique_options_are_a_400_naming_the_field(world, extra, field):
    body = {**_body(world), **extra}
    if body.get("unique_key") is None:
        body.pop("unique_key")
    r = world.producer().post("jobs", json=body)
    assert r.status_code == 400, r.content
    assert r.json()["code"] == "validation_error"
    assert field in r.json()["fields"], r.json()
    assert not Job.objects.exists()


def test_the_longest_key_and_every_option_at_its_bound_are_taken(world):
    r = world.producer().post("jobs", json=_body(
        world, key="k" * 255, unique_states=["queued", "pending", "in_progress"],
        on_conflict="skip", debounce_seconds=86_400, debounce_max_seconds=7 * 86_400))
    assert r.status_code == 201, r.content
