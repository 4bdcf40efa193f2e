"""Schedules over HTTP (#30 item 3; docs/api.md "Schedules"): create, list, read, change,
pause and resume, trigger and delete, with the workspace key; each bad input a 400 naming its
field with nothing created; a fire's job shows its schedule_id and scheduled_for."""

import datetime as dt

import pytest

from jobqueue.db import db_now
from jobqueue.maintenance import schedules as service
from jobqueue.models import Job, Schedule, ScheduleFire


def _body(world, **extra):
    return {"name": "nightly", "cron": "30 2 * * *", "timezone": "Europe/Berlin",
            "job": {"job_agent_id": str(world.agent.id), "dispatch_context": {"token": "s3"},
                    "job_agent_config": {"command": ["make", "report"]}, "priority": 2},
            **extra}


def _patch(caller, path, body):
    return caller.request("PATCH", path, json_body=body)


def _utc(text):
    when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    assert when.utcoffset() == dt.timedelta(0), text
    return when


def test_create_read_list_change_and_delete_a_schedule(world):
    producer = world.producer()
    r = producer.post("schedules", json=_body(world))
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["name"] == "nightly" and body["cron"] == "30 2 * * *"
    assert body["timezone"] == "Europe/Berlin" and body["overlap"] == "skip"
    assert body["catchup_window_seconds"] == 60 and body["paused"] is False
    assert body["job"]["job_agent_id"] == str(world.agent.id)
    assert body["job"]["priority"] == 2 and body["job"]["dispatch_context_keys"] == ["token"]
    assert "s3" not in r.content.decode() and "dispatch_context" not in body["job"]
    assert body["fires"] == {"fired": 0, "skipped": 0, "missed": 0}
    times = [_utc(t) for t in body["next_fire_times"]]
    assert len(times) == 5 and times == sorted(times)
    assert all(t.astimezone(__import__("zoneinfo").ZoneInfo("Europe/Berlin")).hour in (2, 3)
               for t in times)
    assert body["last_fire_at"] is None and body["last_job_id"] is None
    schedule_id = body["id"]

    assert producer.get(f"schedules/{schedule_id}").json() == body
    page = producer.get("schedules").json()
    assert [s["id"] for s in page["results"]] == [schedule_id]
    assert page["results"][0]["next_fire_times"] == body["next_fire_times"]

    changed = _patch(producer, f"schedules/{schedule_id}",
                     {"cron": "0 6 * * 1-5", "overlap": "allow", "catchup_window_seconds": 0,
                      "job": {"job_agent_id": str(world.agent.id), "priority": 7}})
    assert changed.status_code == 200, changed.content
    assert changed.json()["cron"] == "0 6 * * 1-5" and changed.json()["overlap"] == "allow"
    assert changed.json()["job"] == {"job_agent_id": str(world.agent.id), "priority": 7,
                                     "job_agent_config": {}, "external_id": "", "hold": False,
                                     "dispatch_context_keys": []}

    assert producer.delete(f"schedules/{schedule_id}").status_code == 204
    assert producer.get(f"schedules/{schedule_id}").status_code == 404
    assert producer.delete(f"schedules/{schedule_id}").status_code == 404


def test_pause_and_resume(world):
    producer = world.producer()
    schedule_id = producer.post("schedules", json=_body(world, paused=True)).json()["id"]
    Schedule.objects.filter(id=schedule_id).update(
        next_fire_at=dt.datetime(2020, 1, 1, tzinfo=dt.UTC))
    assert service.run_once()["schedules"] == 0
    paused = producer.get(f"schedules/{schedule_id}").json()
    assert paused["paused"] is True and paused["paused_at"] is not None
    assert len(paused["next_fire_times"]) == 5
    resumed = _patch(producer, f"schedules/{schedule_id}", {"paused": False})
    assert resumed.status_code == 200 and resumed.json()["paused"] is False
    assert _utc(resumed.json()["next_fire_times"][0]) > dt.datetime.now(dt.UTC)
    again = _patch(producer, f"schedules/{schedule_id}", {"paused": True})
    assert again.json()["paused"] is True
    assert not Job.objects.exists()


def test_a_fire_and_a_trigger_make_jobs_that_show_their_schedule(world):
    producer = world.producer()
    schedule_id = producer.post("schedules", json=_body(world, overlap="allow")).json()["id"]
    when = db_now().replace(microsecond=0) - dt.timedelta(seconds=30)
    Schedule.objects.filter(id=schedule_id).update(next_fire_at=when)
    service.run_once()
    fired = Job.objects.get(scheduled_for=when)
    shown = producer.get(f"jobs/{fired.id}").json()
    assert shown["schedule_id"] == schedule_id
    assert _utc(shown["scheduled_for"]) == when
    listed = producer.get("jobs").json()["results"]
    assert {j["schedule_id"] for j in listed} == {schedule_id}

    r = producer.post(f"schedules/{schedule_id}/trigger")
    assert r.status_code == 201, r.content
    job = r.json()
    assert job["schedule_id"] == schedule_id and job["deduplicated"] is False
    assert job["scheduled_for"] is not None and job["priority"] == 2
    schedule = producer.get(f"schedules/{schedule_id}").json()
    assert schedule["last_job_id"] == job["id"]
    assert schedule["fires"]["fired"] >= 2
    assert producer.post(f"schedules/{schedule_id}/trigger",
                         json={"x": 1}).status_code == 400
    # A plain job says it has no schedule.
    plain = producer.post("jobs", json={"job_agent_id": str(world.agent.id)}).json()
    assert plain["schedule_id"] is None and plain["scheduled_for"] is None


def test_a_trigger_deduplicated_by_the_unique_key_answers_200(world):
    producer = world.producer()
    body = _body(world)
    body["job"]["unique_key"] = "nightly"
    schedule_id = producer.post("schedules", json=body).json()["id"]
    first = producer.post(f"schedules/{schedule_id}/trigger")
    second = producer.post(f"schedules/{schedule_id}/trigger")
    assert (first.status_code, second.status_code) == (201, 200)
    assert second.json()["deduplicated"] is True and second.json()["id"] == first.json()["id"]


@pytest.mark.parametrize("change, field", [
    ({"cron": "not a cron"}, "cron"),
    ({"cron": "0 0 30 2 *"}, "cron"),
    ({"cron": "* * * * * *"}, "cron"),
    ({"cron": 5}, "cron"),
    ({"timezone": "Mars/Olympus_Mons"}, "timezone"),
    ({"timezone": "Europe/../etc"}, "timezone"),
    ({"catchup_window_seconds": -1}, "catchup_window_seconds"),
    ({"catchup_window_seconds": 604_801}, "catchup_window_seconds"),
    ({"catchup_window_seconds": "60"}, "catchup_window_seconds"),
    ({"overlap": "sometimes"}, "overlap"),
    ({"paused": "yes"}, "paused"),
    ({"name": ""}, "name"),
    ({"job": {"priority": 1}}, "job"),  # no job_agent_id
    ({"job": {"job_agent_id": "nope"}}, "job"),
    ({"job": {"job_agent_id": "00000000-0000-4000-8000-000000000000"}}, "job"),
    ({"job": {"job_agent_id": "AGENT", "max_attempts": 0}}, "job"),
    ({"job": {"job_agent_id": "AGENT", "priority": "high"}}, "job"),
    ({"job": {"job_agent_id": "AGENT", "debounce_seconds": 5}}, "job"),
    ({"job": {"job_agent_id": "AGENT", "on_conflict": "merge", "unique_key": "k"}}, "job"),
    ({"job": {"job_agent_id": "AGENT", "expires_at": "2030-01-01T00:00:00Z"}}, "job"),
    ({"job": {"job_agent_id": "AGENT", "nonsense": 1}}, "job"),
    ({"surprise": 1}, "surprise"),
])
def test_bad_input_is_a_400_naming_the_field_and_nothing_is_created(world, change, field):
    producer = world.producer()
    if isinstance(change.get("job"), dict) and change["job"].get("job_agent_id") == "AGENT":
        change = {"job": {**change["job"], "job_agent_id": str(world.agent.id)}}
    r = producer.post("schedules", json={**_body(world), **change})
    assert r.status_code == 400, r.content
    assert r.json()["code"] == "validation_error" and field in r.json()["fields"], r.json()
    assert not Schedule.objects.exists()
    # The same change of an existing schedule: refused, nothing changed.
    schedule_id = producer.post("schedules", json=_body(world, name="kept")).json()["id"]
    before = list(Schedule.objects.values())
    r = _patch(producer, f"schedules/{schedule_id}", change)
    assert r.status_code == 400, r.content
    assert field in r.json()["fields"]
    assert list(Schedule.objects.values()) == before


def test_a_second_schedule_with_the_name_is_a_400_naming_name(world):
    producer = world.producer()
    assert producer.post("schedules", json=_body(world)).status_code == 201
    r = producer.post("schedules", json=_body(world))
    assert r.status_code == 400 and "name" in r.json()["fields"]
    other = producer.post("schedules", json=_body(world, name="other")).json()["id"]
    r = _patch(producer, f"schedules/{other}", {"name": "nightly"})
    assert r.status_code == 400 and "name" in r.json()["fields"]
    assert Schedule.objects.count() == 2


def test_another_workspaces_agent_in_job_is_a_400_and_its_schedule_a_404(world):
    producer = world.producer()
    body = _body(world)
    body["job"]["job_agent_id"] = str(world.other_workspace_agent.id)
    r = producer.post("schedules", json=body)
    assert r.status_code == 400 and "job" in r.json()["fields"]
    schedule_id = producer.post("schedules", json=_body(world)).json()["id"]
    r = _patch(producer, f"schedules/{schedule_id}", {"job": body["job"]})
    assert r.status_code == 400 and "job" in r.json()["fields"]
    for method, path in (("GET", "schedules/nope"), ("PATCH", "schedules/nope"),
                         ("POST", "schedules/nope/trigger"), ("DELETE", "schedules/nope")):
        assert producer.request(method, path, json_body={} if method == "PATCH" else None
                                ).status_code == 404
    assert _patch(producer, "schedules/00000000-0000-4000-8000-000000000000",
                  {"job": _body(world)["job"]}).status_code == 404
    assert not ScheduleFire.objects.exists()
