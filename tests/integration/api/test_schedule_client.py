"""The producer's client library and command line on schedules, against a live server:
ProducerClient's schedule methods, and `jobqueue schedules create|list|get|pause|resume|
trigger|delete` (text and --json)."""

import datetime as dt
import io
import json
from contextlib import redirect_stderr, redirect_stdout

import pytest
from jobqueue_client import ProducerClient, producer_cli
from jobqueue_client.errors import InvalidRequest, NotFound

from jobqueue.db import db_now
from jobqueue.maintenance import schedules as service
from jobqueue.models import Job, Schedule

pytestmark = pytest.mark.usefixtures("wakeups_stopped_after")


@pytest.fixture
def producer(live_world):
    with ProducerClient(live_world.base_url, str(live_world.workspace.id),
                        live_world.key) as client:
        yield client


def test_the_client_creates_lists_pauses_triggers_and_deletes(live_world, producer):
    job = {"job_agent_id": str(live_world.agent.id), "dispatch_context": {"token": "x"},
           "job_agent_config": {"command": ["make", "report"]}}
    made = producer.create_schedule("nightly", "30 2 * * *", job, timezone="Europe/Berlin",
                                    overlap="allow", catchup_window_seconds=3600)
    assert made["name"] == "nightly" and len(made["next_fire_times"]) == 5
    assert made["job"]["dispatch_context_keys"] == ["token"]
    assert producer.get_schedule(made["id"]) == made
    assert [s["id"] for s in producer.list_schedules()] == [made["id"]]
    producer.create_schedule("hourly", "0 * * * *", job)
    assert len(list(producer.list_schedules(page_size=1))) == 2
    assert len(list(producer.list_schedules(limit=1))) == 1
    assert producer.pause_schedule(made["id"])["paused"] is True
    assert producer.resume_schedule(made["id"])["paused"] is False
    assert producer.update_schedule(made["id"], name="nightly-2")["name"] == "nightly-2"
    fired = producer.trigger_schedule(made["id"])
    assert fired["schedule_id"] == made["id"] and fired["deduplicated"] is False
    with pytest.raises(InvalidRequest) as refused:
        producer.create_schedule("bad", "0 0 30 2 *", job)
    assert "cron" in refused.value.fields
    producer.delete_schedule(made["id"])
    with pytest.raises(NotFound):
        producer.get_schedule(made["id"])


def _cli(live_world, *argv, stdin=None):
    out, err = io.StringIO(), io.StringIO()
    env = {"JOBQUEUE_URL": live_world.base_url,
           "JOBQUEUE_WORKSPACE": str(live_world.workspace.id),
           "JOBQUEUE_API_KEY": live_world.key}
    with pytest.MonkeyPatch.context() as mp:
        for name, value in env.items():
            mp.setenv(name, value)
        mp.delenv("JOBQUEUE_AGENT", raising=False)
        with redirect_stdout(out), redirect_stderr(err):
            code = producer_cli.main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def test_the_command_line(live_world, tmp_path):
    context = tmp_path / "context.json"
    context.write_text('{"token": "s3cret"}')
    code, out, err = _cli(live_world, "schedules", "create", "--name", "nightly", "--cron",
                          "30 2 * * *", "--timezone", "America/New_York",
                          "--agent", live_world.agent.id,
                          "--context", context, "--priority", 3, "--overlap", "buffer_one",
                          "--catchup-window-seconds", 120, "--max-attempts", 2,
                          "--group", "nightly", "--", "make", "report")
    assert code == 0, err
    assert "30 2 * * *  (America/New_York)" in out and "buffer_one" in out
    assert "s3cret" not in out and "token" in out
    schedule = Schedule.objects.get()
    assert schedule.job["job_agent_config"] == {"command": ["make", "report"]}
    assert (schedule.job["priority"], schedule.job["max_attempts"]) == (3, 2)
    sid = str(schedule.id)

    code, out, _ = _cli(live_world, "schedules", "list")
    assert code == 0 and sid in out and "NEXT_FIRE" in out
    code, out, _ = _cli(live_world, "schedules", "list", "--json", "--all")
    assert [s["id"] for s in json.loads(out)] == [sid]
    code, out, _ = _cli(live_world, "schedules", "get", sid, "--json")
    assert json.loads(out)["id"] == sid
    code, out, _ = _cli(live_world, "schedules", "pause", sid)
    assert code == 0 and "yes, since" in out
    code, out, _ = _cli(live_world, "schedules", "resume", sid, "--json")
    assert json.loads(out)["paused"] is False
    code, out, _ = _cli(live_world, "schedules", "trigger", sid, "--json")
    assert code == 0 and json.loads(out)["schedule_id"] == sid
    # A fire by maintenance: its job carries the schedule and its fire time.
    Schedule.objects.filter(id=sid).update(
        next_fire_at=db_now() - dt.timedelta(seconds=1), overlap="allow")
    service.run_once()
    assert Job.objects.filter(schedule_id=sid, scheduled_for__isnull=False).count() == 2
    code, out, _ = _cli(live_world, "schedules", "get", sid)
    assert "fired 2" in out
    code, out, err = _cli(live_world, "schedules", "create", "--name", "x", "--cron", "61 * * * *",
                          "--agent", live_world.agent.id)
    assert code == 2 and "cron" in err
    code, out, err = _cli(live_world, "schedules", "create", "--name", "x", "--cron", "* * * * *")
    assert code == 2 and "--agent" in err
    code, out, _ = _cli(live_world, "schedules", "delete", sid)
    assert code == 0 and "deleted" in out
    code, out, err = _cli(live_world, "schedules", "get", sid)
    assert code == 3 and "schedule" in err
    code, out, _ = _cli(live_world, "schedules", "list")
    assert code == 0 and "no schedules" in out + _


def test_the_command_line_quiet_limits_and_a_deduplicated_trigger(live_world):
    for name in ("a", "b"):
        code, out, err = _cli(live_world, "schedules", "create", "--name", name, "--cron",
                              "0 3 * * *", "--agent", live_world.agent.id, "--unique-key",
                              "nightly", "--paused", "-q")
        assert code == 0, err
        assert out.strip() == str(Schedule.objects.get(name=name).id)
    code, out, err = _cli(live_world, "schedules", "list", "--limit", 1)
    assert code == 0 and out.count("\n") == 2 and "--limit N or --all" in err
    sid = out.strip().splitlines()[1].split()[0]
    assert _cli(live_world, "schedules", "trigger", sid)[0] == 0
    code, out, err = _cli(live_world, "schedules", "trigger", sid)
    assert code == 0 and "no job created" in err
    code, out, _ = _cli(live_world, "schedules", "delete", sid, "--json")
    assert json.loads(out) == {"id": sid, "deleted": True}


def test_the_command_line_refuses_a_command_twice_and_two_stdins(live_world):
    code, _, err = _cli(live_world, "schedules", "create", "--name", "x", "--cron", "* * * * *",
                        "--agent", live_world.agent.id, "--config", '{"command": ["a"]}',
                        "--", "b")
    assert code == 2 and "not both" in err
    code, _, err = _cli(live_world, "schedules", "create", "--name", "x", "--cron", "* * * * *",
                        "--agent", live_world.agent.id, "--config", "-", "--context", "-")
    assert code == 2 and "stdin" in err
