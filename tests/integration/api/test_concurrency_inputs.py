"""Concurrency keys, their inputs and outputs (#29; docs/api.md "Concurrency keys"): POST jobs,
each job of POST flows and a schedule's `job` take `concurrency_key` (1 to 255 printable
characters) and `concurrency_limit` (1 to 1000, default 1 with a key); every job shape shows
both (null for a plain job), never the internal `concurrency_held`; each bad input is a 400
validation_error naming its field, and nothing is created."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest

from jobqueue.db import db_now
from jobqueue.maintenance import schedules as service
from jobqueue.models import Job, Schedule

pytestmark = pytest.mark.django_db


def _create(world, **body):
    r = world.producer().post("jobs", json={"job_agent_id": str(world.agent.id), **body})
    assert r.status_code == 201, r.content
    return r.json()


def _shapes(world, job_id):
    """The job as GET jobs/{id} and GET jobs show it."""
    producer = world.producer()
    detail = producer.get(f"jobs/{job_id}").json()
    [summary] = [j for j in producer.get("jobs").json()["results"] if j["id"] == job_id]
    return detail, summary


def test_a_key_alone_gets_the_default_limit_of_1_in_every_shape(world):
    made = _create(world, concurrency_key="deploy:prod")
    assert made["concurrency_key"] == "deploy:prod" and made["concurrency_limit"] == 1
    assert "concurrency_held" not in made
    for shape in _shapes(world, made["id"]):
        assert shape["concurrency_key"] == "deploy:prod" and shape["concurrency_limit"] == 1
        assert "concurrency_held" not in shape
    job = Job.objects.get(id=made["id"])
    assert (job.concurrency_key, job.concurrency_limit) == ("deploy:prod", 1)


def test_a_key_and_a_limit(world):
    made = _create(world, concurrency_key="partner-api", concurrency_limit=5)
    assert (made["concurrency_key"], made["concurrency_limit"]) == ("partner-api", 5)
    for shape in _shapes(world, made["id"]):
        assert (shape["concurrency_key"], shape["concurrency_limit"]) == ("partner-api", 5)
    # The bounds themselves are accepted; a null limit is the default; a labelled job too.
    top = _create(world, concurrency_key="k" * 255, concurrency_limit=1000)
    assert (top["concurrency_key"], top["concurrency_limit"]) == ("k" * 255, 1000)
    assert _create(world, concurrency_key="k", concurrency_limit=None)["concurrency_limit"] == 1
    r = world.producer().post("jobs", json={"labels": ["gpu"], "concurrency_key": "gpu-pool",
                                            "concurrency_limit": 2})
    assert r.status_code == 201, r.content
    assert (r.json()["concurrency_key"], r.json()["concurrency_limit"]) == ("gpu-pool", 2)


def test_a_plain_job_shows_nulls(world):
    made = _create(world)
    assert made["concurrency_key"] is None and made["concurrency_limit"] is None
    for shape in _shapes(world, made["id"]):
        assert shape["concurrency_key"] is None and shape["concurrency_limit"] is None
        assert "concurrency_held" not in shape
    assert _create(world, concurrency_key=None)["concurrency_key"] is None


@pytest.mark.parametrize("body, field", [
    ({"concurrency_limit": 2}, "concurrency_limit"),
    ({"concurrency_key": None, "concurrency_limit": 2}, "concurrency_limit"),
    ({"concurrency_key": ""}, "concurrency_key"),
    ({"concurrency_key": "k" * 256}, "concurrency_key"),
    ({"concurrency_key": "new\nline"}, "concurrency_key"),
    ({"concurrency_key": "tab\there"}, "concurrency_key"),
    ({"concurrency_key": 7}, "concurrency_key"),
    ({"concurrency_key": ["k"]}, "concurrency_key"),
    ({"concurrency_key": {"k": 1}}, "concurrency_key"),
    ({"concurrency_key": True}, "concurrency_key"),
    ({"concurrency_key": "k", "concurrency_limit": 0}, "concurrency_limit"),
    ({"concurrency_key": "k", "concurrency_limit": -1}, "concurrency_limit"),
    ({"concurrency_key": "k", "concurrency_limit": 1001}, "concurrency_limit"),
    ({"concurrency_key": "k", "concurrency_limit": 2**40}, "concurrency_limit"),
    ({"concurrency_key": "k", "concurrency_limit": "2"}, "concurrency_limit"),
    ({"concurrency_key": "k", "concurrency_limit": 2.5}, "concurrency_limit"),
    ({"concurrency_key": "k", "concurrency_limit": True}, "concurrency_limit"),
    ({"concurrency_key": "k", "concurrency_limit": [2]}, "concurrency_limit"),
])
def test_bad_input_is_a_400_naming_the_field_and_nothing_is_created(world, body, field):
    before = Job.objects.count()
    r = world.producer().post("jobs", json={"job_agent_id": str(world.agent.id), **body})
    assert r.status_code == 400, r.content
    assert r.json()["code"] == "validation_error" and field in r.json()["fields"], r.json()
    assert Job.objects.count() == before


def test_an_idempotent_replay_counts_the_fields_as_sent(world):
    producer = world.producer()
    body = {"job_agent_id": str(world.agent.id), "concurrency_key": "k"}
    key = {"Idempotency-Key": "conc-1"}
    first = producer.post("jobs", json=body, headers=key)
    assert first.status_code == 201, first.content
    again = producer.post("jobs", json=body, headers=key)
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    assert again.json()["concurrency_limit"] == 1
    for other in ({**body, "concurrency_limit": 1}, {**body, "concurrency_key": "other"},
                  {"job_agent_id": str(world.agent.id)}):
        assert producer.post("jobs", json=other, headers=key).status_code == 422
    assert Job.objects.count() == 1


def test_a_flow_takes_them_per_job(world):
    agent = str(world.agent.id)
    r = world.producer().post("flows", json={"jobs": [
        {"ref": "a", "job_agent_id": agent, "concurrency_key": "deploy"},
        {"ref": "b", "job_agent_id": agent, "concurrency_key": "deploy", "concurrency_limit": 3,
         "depends_on_refs": ["a"]},
        {"ref": "c", "labels": ["gpu"], "concurrency_key": "gpu", "concurrency_limit": 1000},
        {"ref": "d", "job_agent_id": agent},
    ]})
    assert r.status_code == 201, r.content
    jobs = r.json()["jobs"]
    shown = {ref: (j["concurrency_key"], j["concurrency_limit"]) for ref, j in jobs.items()}
    assert shown == {"a": ("deploy", 1), "b": ("deploy", 3), "c": ("gpu", 1000),
                     "d": (None, None)}
    assert all("concurrency_held" not in j for j in jobs.values())
    stored = dict(Job.objects.values_list("id", "concurrency_limit"))
    assert {ref: stored[uuid.UUID(j["id"])] for ref, j in jobs.items()} == {
        "a": 1, "b": 3, "c": 1000, "d": None}


@pytest.mark.parametrize("item, field", [
    ({"concurrency_limit": 2}, "jobs[1].concurrency_limit"),
    ({"concurrency_key": "k", "concurrency_limit": 0}, "0: concurrency_limit"),
    ({"concurrency_key": "k", "concurrency_limit": 1001}, "0: concurrency_limit"),
    ({"concurrency_key": "k", "concurrency_limit": "2"}, "0: concurrency_limit"),
    ({"concurrency_key": ""}, "0: concurrency_key"),
    ({"concurrency_key": "k" * 256}, "0: concurrency_key"),
    ({"concurrency_key": 7}, "0: concurrency_key"),
    ({"concurrency_key": "new\nline"}, "jobs[1].concurrency_key"),
])
def test_a_bad_flow_job_is_400_naming_the_field_and_nothing_is_made(world, item, field):
    """A field the body's shape refuses is named within `jobs` ("1: concurrency_limit: ..."),
    one the lifecycle's rule refuses as jobs[1].field; either way, no job of the flow."""
    agent = str(world.agent.id)
    before = Job.objects.count()
    r = world.producer().post("flows", json={"jobs": [
        {"ref": "ok", "job_agent_id": agent, "concurrency_key": "fine"},
        {"ref": "bad", "job_agent_id": agent, **item}]})
    assert r.status_code == 400, r.content
    body = r.json()
    assert body["code"] == "validation_error", body
    if field.startswith("jobs["):
        assert field in body["fields"], body
    else:
        assert body["fields"]["jobs"][0].startswith("1: " + field.split(": ", 1)[1]), body
    assert Job.objects.count() == before


def _schedule(world, **job):
    return {"name": "nightly", "cron": "30 2 * * *", "overlap": "allow",
            "job": {"job_agent_id": str(world.agent.id), **job}}


def test_a_schedule_keeps_them_and_its_jobs_carry_them(world):
    producer = world.producer()
    r = producer.post("schedules", json=_schedule(world, concurrency_key="report",
                                                  concurrency_limit=2))
    assert r.status_code == 201, r.content
    schedule = r.json()
    assert schedule["job"]["concurrency_key"] == "report"
    assert schedule["job"]["concurrency_limit"] == 2
    assert producer.get(f"schedules/{schedule['id']}").json()["job"] == schedule["job"]
    # A trigger's job and a fire's job.
    triggered = producer.post(f"schedules/{schedule['id']}/trigger")
    assert triggered.status_code == 201, triggered.content
    assert (triggered.json()["concurrency_key"], triggered.json()["concurrency_limit"]) == (
        "report", 2)
    when = db_now().replace(microsecond=0) - dt.timedelta(seconds=30)
    Schedule.objects.filter(id=schedule["id"]).update(next_fire_at=when)
    service.run_once()
    fired = Job.objects.get(scheduled_for=when)
    assert (fired.concurrency_key, fired.concurrency_limit) == ("report", 2)
    # A new job body without a limit: the default, 1, on its jobs.
    r = producer.request("PATCH", f"schedules/{schedule['id']}",
                         json_body={"job": {"job_agent_id": str(world.agent.id),
                                            "concurrency_key": "report"}})
    assert r.status_code == 200, r.content
    assert r.json()["job"]["concurrency_key"] == "report"
    job = producer.post(f"schedules/{schedule['id']}/trigger").json()
    assert (job["concurrency_key"], job["concurrency_limit"]) == ("report", 1)
    # A schedule without a key makes plain jobs.
    plain = producer.post("schedules", json={**_schedule(world), "name": "plain"}).json()
    assert "concurrency_key" not in plain["job"]
    job = producer.post(f"schedules/{plain['id']}/trigger").json()
    assert job["concurrency_key"] is None and job["concurrency_limit"] is None


@pytest.mark.parametrize("job", [
    {"concurrency_limit": 2},
    {"concurrency_key": ""},
    {"concurrency_key": "k" * 256},
    {"concurrency_key": "new\nline"},
    {"concurrency_key": 7},
    {"concurrency_key": "k", "concurrency_limit": 0},
    {"concurrency_key": "k", "concurrency_limit": 1001},
    {"concurrency_key": "k", "concurrency_limit": "2"},
    {"concurrency_key": "k", "concurrency_limit": True},
])
def test_a_bad_schedule_job_is_400_naming_job_and_nothing_is_made(world, job):
    producer = world.producer()
    field = next(iter(job)) if len(job) == 1 else "concurrency_limit"
    r = producer.post("schedules", json=_schedule(world, **job))
    assert r.status_code == 400, r.content
    body = r.json()
    assert body["code"] == "validation_error" and "job" in body["fields"], body
    assert body["fields"]["job"][0].startswith(field), body
    assert not Schedule.objects.exists() and not Job.objects.exists()
    # The same job as a change of an existing schedule: refused, nothing changed.
    schedule_id = producer.post("schedules", json=_schedule(world)).json()["id"]
    before = list(Schedule.objects.values())
    r = producer.request("PATCH", f"schedules/{schedule_id}",
                         json_body={"job": _schedule(world, **job)["job"]})
    assert r.status_code == 400, r.content
    assert "job" in r.json()["fields"]
    assert list(Schedule.objects.values()) == before
