"""Schedules fired by maintenance (#30 item 3; docs/api.md "Schedules"): each fire time makes
one job with schedule_id and scheduled_for, a fire time missed while maintenance was down is
made up within the catch-up window and recorded missed past it, the overlap policies. Fire
times are put in the past by the database's clock (next_fire_at moved back), never slept for.
"""

import datetime as dt
import time

import pytest
from django.core.management import call_command
from django.db import IntegrityError, transaction

from jobqueue import lifecycle, states
from jobqueue.db import db_now
from jobqueue.exceptions import GroupCancelled, InvalidInput, NotFound
from jobqueue.lifecycle import schedules
from jobqueue.maintenance import loop
from jobqueue.maintenance import schedules as service
from jobqueue.models import Job, JobEvent, MaintenanceRun, Schedule, ScheduleFire
from tests.factories import JobAgentFactory

pytestmark = pytest.mark.django_db

MINUTE = dt.timedelta(minutes=1)


def _schedule(agent=None, cron_expr="* * * * *", **options):
    agent = agent or JobAgentFactory()
    options.setdefault("job", {"dispatch_context": {"n": 1}})
    return schedules.create_schedule(workspace=agent.workspace, name=options.pop("name", "s"),
                                     cron_expr=cron_expr, job_agent=agent, **options)


def _due(schedule, ago: dt.timedelta) -> dt.datetime:
    """Move the schedule's next fire time back to the whole minute `ago` before now (the
    database's): as if maintenance had not run since. Returns that fire time. In a minute's
    last 15 s it waits for the next minute first, so that the test's fires run before the
    minute turns (another fire time of an every-minute cron would fall due)."""
    now = db_now()
    if now.second >= 45:
        time.sleep(60.5 - now.second - now.microsecond / 1e6)
        now = db_now()
    when = now.replace(second=0, microsecond=0) - ago
    Schedule.objects.filter(id=schedule.id).update(next_fire_at=when)
    return when


# A cron that fires once a year: fire times a test sets in the last half minute are followed by
# no other due fire time, whatever second of the minute the test runs in (a fire time of "the
# whole minute + N s" lies in the future during the minute's first N seconds).
YEARLY = "0 0 1 1 *"


def _recent(schedule) -> dt.datetime:
    """A fire time 30 s before now (the database's), within the default catch-up window; the
    schedule's next fire time is put there. Returns it."""
    when = db_now() - dt.timedelta(seconds=30)
    Schedule.objects.filter(id=schedule.id).update(next_fire_at=when)
    return when


def _fires(schedule):
    return list(ScheduleFire.objects.filter(schedule=schedule).order_by("fire_time")
                .values_list("fire_time", "outcome"))


def test_a_due_fire_time_makes_one_job_with_its_schedule_and_time():
    schedule = _schedule(job={"dispatch_context": {"n": 1}, "priority": 3,
                              "job_agent_config": {"command": ["true"]}})
    assert schedule.next_fire_at > db_now()
    when = _due(schedule, dt.timedelta(0))
    counts = service.run_once()
    assert counts == {"schedules": 1, "fired": 1, "skipped": 0, "missed": 0}
    job = Job.objects.get()
    assert (job.schedule_id, job.scheduled_for) == (schedule.id, when)
    assert job.status == states.QUEUED and job.priority == 3
    assert job.dispatch_context == {"n": 1} and job.job_agent_config == {"command": ["true"]}
    assert job.events.get(kind=JobEvent.CREATED).actor == f"schedule:{schedule.id}"
    schedule.refresh_from_db()
    assert schedule.next_fire_at == when + MINUTE and schedule.next_fire_at > db_now() - MINUTE
    assert (schedule.last_fire_at, schedule.last_job_id, schedule.fired) == (when, job.id, 1)
    assert _fires(schedule) == [(when, "fired")]
    # Nothing is due any more: another run fires nothing.
    assert service.run_once()["schedules"] in (0, 1)  # 1 only if a minute turned meanwhile
    assert Job.objects.filter(scheduled_for=when).count() == 1


def test_fires_missed_while_maintenance_was_down_are_made_up_within_the_window():
    # Ten fire times passed; those at most 180 s (+ the service's interval) old are made up.
    schedule = _schedule(overlap="allow", catchup_window_seconds=180)
    first = _due(schedule, 10 * MINUTE)
    now = db_now()
    counts = service.run_once()
    late = dt.timedelta(seconds=180 + 5)
    times = [first + i * MINUTE for i in range(11) if first + i * MINUTE <= now]
    expected_missed = [t for t in times if now - t > late]
    assert counts["missed"] == len(expected_missed) and counts["missed"] >= 6
    assert counts["fired"] == len(times) - len(expected_missed) >= 3
    fired = sorted(Job.objects.values_list("scheduled_for", flat=True))
    assert fired == [t for t in times if t not in expected_missed]
    assert [o for _, o in _fires(schedule)] == (["missed"] * len(expected_missed)
                                                + ["fired"] * len(fired))
    schedule.refresh_from_db()
    assert (schedule.fired, schedule.missed, schedule.skipped) == (len(fired),
                                                                   len(expected_missed), 0)


def test_a_catchup_window_of_zero_still_fires_a_fire_time_on_time_but_none_older():
    schedule = _schedule(catchup_window_seconds=0)
    _due(schedule, 2 * MINUTE)
    counts = service.run_once()
    assert counts["missed"] >= 2 and counts["fired"] <= 1


def test_skip_makes_nothing_while_the_previous_job_is_live():
    schedule = _schedule(cron_expr=YEARLY)  # skip is the default
    first = _recent(schedule)
    assert service.run_once()["fired"] == 1
    job = Job.objects.get()
    second = first + dt.timedelta(seconds=1)
    Schedule.objects.filter(id=schedule.id).update(next_fire_at=second)
    assert service.run_once()["skipped"] == 1
    fire = ScheduleFire.objects.get(schedule=schedule, fire_time=second)
    assert fire.outcome == "skipped" and fire.job_id is None and "previous" in fire.detail
    # Once it has ended, the next fire makes a job.
    lifecycle.cancel_job(job.id, actor="t")
    Schedule.objects.filter(id=schedule.id).update(next_fire_at=second + dt.timedelta(seconds=1))
    assert service.run_once()["fired"] == 1
    assert Job.objects.count() == 2


def test_buffer_one_keeps_at_most_one_job_waiting():
    agent = JobAgentFactory()
    schedule = _schedule(agent, cron_expr=YEARLY, overlap="buffer_one")
    base = _recent(schedule)

    def fire_at(offset):
        Schedule.objects.filter(id=schedule.id).update(
            next_fire_at=base + dt.timedelta(seconds=offset))
        return service.run_once()

    assert fire_at(0)["fired"] == 1
    assert fire_at(1)["skipped"] == 1  # the first one waits (queued)
    lifecycle.claim_next_job(agent)  # claimed: no job waits
    assert fire_at(2)["fired"] == 1  # one waits beside the running one
    assert fire_at(3)["skipped"] == 1
    assert Job.objects.filter(status=states.QUEUED).count() == 1
    assert Job.objects.count() == 2


def test_allow_fires_whatever_runs():
    schedule = _schedule(cron_expr=YEARLY, overlap="allow")
    base = _recent(schedule)
    for offset in range(3):
        Schedule.objects.filter(id=schedule.id).update(
            next_fire_at=base + dt.timedelta(seconds=offset))
        assert service.run_once()["fired"] == 1
    assert Job.objects.filter(schedule_id=schedule.id, status=states.QUEUED).count() == 3


def test_a_paused_schedule_fires_nothing_and_resumes_from_now():
    schedule = _schedule()
    _due(schedule, 5 * MINUTE)
    schedules.update_schedule(schedule.id, workspace_id=schedule.workspace_id, paused=True)
    assert service.run_once()["schedules"] == 0
    resumed = schedules.update_schedule(schedule.id, workspace_id=schedule.workspace_id,
                                        paused=False)
    assert resumed.paused_at is None and resumed.next_fire_at > db_now()
    assert service.run_once()["schedules"] == 0  # the paused stretch is not made up
    assert not Job.objects.exists() and not ScheduleFire.objects.exists()


def test_a_fire_time_handled_already_is_not_handled_again_and_stops_no_other_schedule():
    # A next fire time that was handled already (a resume in a fall-back's repeated hour once
    # put it there: jobqueue/cron.py) broke schedule_fire_once and rolled back every
    # schedule's fires, every pass.
    stuck, other = _schedule(name="stuck", cron_expr=YEARLY), _schedule(name="other",
                                                                          cron_expr=YEARLY)
    when = _recent(stuck)
    assert service.run_once()["schedules"] == 1
    Schedule.objects.filter(id=stuck.id).update(next_fire_at=when)
    other_when = _recent(other)
    assert service.run_once()["schedules"] == 2
    assert _fires(stuck) == [(when, ScheduleFire.FIRED)]
    assert _fires(other) == [(other_when, ScheduleFire.FIRED)]
    stuck.refresh_from_db()
    assert stuck.next_fire_at > db_now() and stuck.last_fire_at == when and stuck.fired == 1
    assert Job.objects.filter(schedule_id=stuck.id).count() == 1


def test_a_fire_whose_job_is_refused_is_recorded_skipped_with_the_reason():
    agent = JobAgentFactory()
    schedule = _schedule(agent, job={"group": "nightly"}, overlap="allow")
    lifecycle.create_job(workspace=agent.workspace, job_agent=agent, group="nightly")
    lifecycle.cancel_group(agent.workspace_id, "nightly", actor="t")
    _due(schedule, dt.timedelta(0))
    assert service.run_once()["skipped"] == 1
    assert ScheduleFire.objects.get().detail == "group_cancelled"
    assert not Job.objects.filter(schedule_id=schedule.id).exists()
    # A trigger's refusal is the caller's error, and nothing is recorded.
    with pytest.raises(GroupCancelled):
        schedules.trigger_schedule(schedule.id, workspace_id=agent.workspace_id)
    assert ScheduleFire.objects.count() == 1


def test_a_fire_deduplicated_by_the_jobs_unique_key_is_skipped():
    schedule = _schedule(job={"unique_key": "nightly", "unique_states": ["queued", "pending"]},
                         cron_expr=YEARLY, overlap="allow")
    assert schedule.job["unique_states"] == ["pending", "queued"]
    base = _recent(schedule)
    assert service.run_once()["fired"] == 1
    Schedule.objects.filter(id=schedule.id).update(next_fire_at=base + dt.timedelta(seconds=1))
    assert service.run_once()["skipped"] == 1
    assert ScheduleFire.objects.filter(outcome="skipped").get().detail == "deduplicated"
    made = schedules.trigger_schedule(schedule.id, workspace_id=schedule.workspace_id)
    assert not made.created and made.deduplicated


def test_a_trigger_fires_now_paused_or_not_and_counts_as_the_latest_job():
    schedule = _schedule(paused=True)
    made = schedules.trigger_schedule(schedule.id, workspace_id=schedule.workspace_id,
                                      actor="producer:api_key:1")
    assert made.created
    job = made.job
    assert job.schedule_id == schedule.id and job.scheduled_for is not None
    schedule.refresh_from_db()
    assert schedule.last_job_id == job.id and schedule.fired == 1
    assert ScheduleFire.objects.get().trigger is True
    # skip: the triggered job is the previous one, live.
    schedules.update_schedule(schedule.id, workspace_id=schedule.workspace_id, paused=False)
    _due(schedule, dt.timedelta(0))
    assert service.run_once()["skipped"] == 1


def test_each_fire_time_is_recorded_once_by_the_database():
    schedule = _schedule()
    when = _due(schedule, dt.timedelta(0))
    service.run_once()
    with pytest.raises(IntegrityError), transaction.atomic():
        ScheduleFire.objects.create(schedule=schedule, fire_time=when, outcome="fired")
    # Triggers are outside the constraint: two at one instant are two fires.
    ScheduleFire.objects.create(schedule=schedule, fire_time=when, outcome="fired", trigger=True)
    ScheduleFire.objects.create(schedule=schedule, fire_time=when, outcome="fired", trigger=True)


def test_fire_records_are_kept_as_long_as_failed_jobs(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "RETENTION_FAILED_DAYS": 2}
    schedule = _schedule()
    old = db_now() - dt.timedelta(days=2, seconds=1)
    ScheduleFire.objects.create(schedule=schedule, fire_time=old, outcome="fired")
    recent = ScheduleFire.objects.create(schedule=schedule, fire_time=old + dt.timedelta(
        minutes=2), outcome="missed")
    _due(schedule, dt.timedelta(0))
    service.run_once()
    assert ScheduleFire.objects.filter(fire_time__lte=old).count() == 0
    assert ScheduleFire.objects.filter(id=recent.id).exists()
    assert ScheduleFire.objects.count() == 2


def test_a_loop_holding_a_stale_next_fire_at_fires_nothing():
    """The conditional advance: a loop that read next_fire_at before another loop advanced
    it updates nothing and makes no job (SQLite's guard, where no row lock skips)."""
    schedule = _schedule()
    _due(schedule, dt.timedelta(0))
    stale = Schedule.objects.select_related("workspace", "job_agent").get(id=schedule.id)
    service.run_once()
    with transaction.atomic():
        assert schedules._fire(stale, db_now()) is None
    assert Job.objects.count() == 1


def test_next_fire_times_are_the_next_five_or_from_now_while_paused():
    schedule = _schedule(cron_expr="0 3 * * *", timezone="Europe/Berlin")
    now = db_now()
    times = schedules.next_fire_times(schedule, now)
    assert len(times) == 5 and times[0] == schedule.next_fire_at
    assert all(b - a in (dt.timedelta(days=1), dt.timedelta(hours=23), dt.timedelta(hours=25))
               for a, b in zip(times, times[1:], strict=False))
    assert all(t.utcoffset() == dt.timedelta(0) for t in times)
    paused = schedules.update_schedule(schedule.id, workspace_id=schedule.workspace_id,
                                       paused=True)
    assert schedules.next_fire_times(paused, now)[0] > now


def test_changing_the_cron_or_time_zone_moves_the_next_fire():
    schedule = _schedule(cron_expr="0 3 * * *")
    moved = schedules.update_schedule(schedule.id, workspace_id=schedule.workspace_id,
                                      cron="30 4 * * *", timezone="America/New_York",
                                      overlap="allow", catchup_window_seconds=0, name="t")
    local = moved.next_fire_at.astimezone(__import__("zoneinfo").ZoneInfo("America/New_York"))
    assert (local.hour, local.minute) == (4, 30)
    assert (moved.overlap, moved.catchup_window_seconds, moved.name) == ("allow", 0, "t")


@pytest.mark.parametrize("options, field", [
    ({"cron_expr": "not a cron"}, "cron"),
    ({"cron_expr": "0 0 30 2 *"}, "cron"),
    ({"cron_expr": "61 * * * *"}, "cron"),
    ({"cron_expr": "0 0 * * * *"}, "cron"),
    ({"timezone": "Mars/Olympus_Mons"}, "timezone"),
    ({"timezone": "../etc/passwd"}, "timezone"),
    ({"catchup_window_seconds": -1}, "catchup_window_seconds"),
    ({"catchup_window_seconds": 7 * 86_400 + 1}, "catchup_window_seconds"),
    ({"overlap": "sometimes"}, "overlap"),
    ({"name": ""}, "name"),
    ({"job": {"debounce_seconds": 5}}, "job"),
    ({"job": {"max_attempts": 0}}, "job"),
    ({"job": {"expires_at": "2030-01-01T00:00:00+00:00"}}, "job"),
    ({"job": {"nonsense": 1}}, "job"),
    ({"job": []}, "job"),
])
def test_bad_input_names_its_field_and_creates_nothing(options, field):
    with pytest.raises(InvalidInput) as refused:
        _schedule(**options)
    assert refused.value.context["field"] == field
    assert not Schedule.objects.exists()


def test_names_are_unique_in_a_workspace_and_agents_must_be_its_own():
    agent = JobAgentFactory()
    _schedule(agent)
    with pytest.raises(InvalidInput) as refused:
        _schedule(agent)
    assert refused.value.context["field"] == "name"
    other = _schedule(agent, name="other")
    with pytest.raises(InvalidInput):
        schedules.update_schedule(other.id, workspace_id=agent.workspace_id, name="s")
    with pytest.raises(NotFound):
        schedules.create_schedule(workspace=JobAgentFactory().workspace, name="x",
                                  cron_expr="* * * * *", job_agent=agent, job={})
    with pytest.raises(NotFound):
        schedules.update_schedule(other.id, workspace_id=agent.workspace_id,
                                  job={}, job_agent=JobAgentFactory())
    with pytest.raises(NotFound):
        schedules.update_schedule(agent.id, workspace_id=agent.workspace_id, paused=True)
    with pytest.raises(NotFound):
        schedules.get_schedule(other.id, workspace_id=JobAgentFactory().workspace_id)
    with pytest.raises(NotFound):
        schedules.trigger_schedule(other.id, workspace_id=JobAgentFactory().workspace_id)
    schedules.delete_schedule(other.id, workspace_id=agent.workspace_id)
    with pytest.raises(NotFound):
        schedules.delete_schedule(other.id, workspace_id=agent.workspace_id)


def test_a_deleted_schedules_jobs_stay_with_its_id():
    schedule = _schedule()
    made = schedules.trigger_schedule(schedule.id, workspace_id=schedule.workspace_id)
    schedules.delete_schedule(schedule.id, workspace_id=schedule.workspace_id)
    assert Job.objects.get(id=made.job.id).schedule_id == schedule.id
    assert not ScheduleFire.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_run_maintenance_runs_the_schedules_service_and_records_it(capsys):
    assert service in loop.SERVICES
    schedule = _schedule(cron_expr=YEARLY)  # one fire time due, whenever the minute turns
    _recent(schedule)
    call_command("run_maintenance")
    assert "schedules: schedules 1, fired 1" in capsys.readouterr().out
    run = MaintenanceRun.objects.filter(service="schedules").get()
    assert run.counts["fired"] == 1
    call_command("fire_schedules", "--json")
    assert '"schedules": 0' in capsys.readouterr().out


def test_fire_schedules_refuses_a_batch_size_under_one():
    from django.core.management.base import CommandError

    with pytest.raises(CommandError):
        call_command("fire_schedules", "--batch-size", "0")


def test_a_plain_jobs_create_claim_and_report_never_touch_the_schedule_tables():
    """A job no schedule made pays nothing: its create, claim and report send no statement
    about schedules (their column on the job is null, in the statements they already sent)."""
    import re

    from tests.utils import statements_sent

    agent = JobAgentFactory()
    with statements_sent() as sent:
        job = lifecycle.create_job(workspace=agent.workspace, job_agent=agent).job
        grant = lifecycle.claim_next_job(agent)
        lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL)
    assert grant.job.id == job.id
    texts = [sql for sql, _ in sent]
    assert texts and not [t for t in texts if re.search(r'\bschedule(_fire)?\b"?\s', t)
                          or "schedule_fire" in t or '"schedule"' in t]
    assert Job.objects.get(id=job.id).schedule_id is None
