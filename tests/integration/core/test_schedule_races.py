"""Schedules under racing maintenance loops (#30 item 3): whatever the number of loops, each
fire time is fired at most once. Real threads, each with its own connection, all running
the schedules service at once over the same due schedules: on PostgreSQL the batch's FOR
UPDATE SKIP LOCKED hands each schedule to one loop, and the conditional advance of
next_fire_at and schedule_fire's unique row would stop a second one; on SQLite BEGIN
IMMEDIATE serializes them and the conditional advance stops the later loops."""

import datetime as dt

import pytest

from jobqueue.db import db_now
from jobqueue.lifecycle import schedules
from jobqueue.maintenance import schedules as service
from jobqueue.models import Job, Schedule, ScheduleFire
from tests.factories import JobAgentFactory
from tests.utils import final_state_is_consistent, run_threads

pytestmark = pytest.mark.django_db(transaction=True)

LOOPS = 6
SCHEDULES = 12


def _due_schedules(minutes_ago: int):
    agent = JobAgentFactory()
    made = [schedules.create_schedule(workspace=agent.workspace, name=f"s{i}",
                                      cron_expr="* * * * *", job_agent=agent, job={},
                                      overlap="allow", catchup_window_seconds=600)
            for i in range(SCHEDULES)]
    first = db_now().replace(second=0, microsecond=0) - dt.timedelta(minutes=minutes_ago)
    Schedule.objects.update(next_fire_at=first)
    return made, first


def _race(batch_size):
    def loop(i, barrier):
        barrier.wait()
        counts = service.run_once(batch_size)
        return counts["fired"]

    return run_threads(loop, LOOPS)


@pytest.mark.parametrize("batch_size", [1, 100])
def test_racing_maintenance_loops_fire_each_fire_time_once(batch_size):
    made, first = _due_schedules(minutes_ago=3)
    fired = _race(batch_size)
    per_schedule = Job.objects.filter(schedule_id=made[0].id).count()
    assert per_schedule >= 4  # first, +1, +2, +3 minutes (and +4 if a minute turned)
    # Every fire time of every schedule: exactly one job and one record, whoever fired it.
    times = list(Job.objects.values_list("schedule_id", "scheduled_for"))
    assert len(times) == len(set(times)) == sum(fired)
    records = list(ScheduleFire.objects.values_list("schedule_id", "fire_time"))
    assert len(records) == len(set(records)) == len(times)
    for schedule in Schedule.objects.all():
        jobs = Job.objects.filter(schedule_id=schedule.id).count()
        assert schedule.fired == jobs and jobs >= 4
        assert min(Job.objects.filter(schedule_id=schedule.id)
                   .values_list("scheduled_for", flat=True)) == first
    final_state_is_consistent()


@pytest.mark.postgres_only
def test_racing_loops_share_the_due_schedules_between_them():
    """SKIP LOCKED, one schedule per batch: the loops take the due schedules side by side,
    none waiting on a schedule another holds, and still fire each fire time once."""
    _due_schedules(minutes_ago=1)
    fired = _race(batch_size=1)
    assert sum(fired) == Job.objects.count() >= 2 * SCHEDULES
    assert len(set(Job.objects.values_list("schedule_id", "scheduled_for"))) == sum(fired)


def test_triggers_pauses_and_loops_racing_keep_the_counts_and_each_fire_time_once():
    """Maintenance loops, triggers and a pause on one schedule at once: each cron fire time
    has at most one job and one record, every trigger its own job, and the schedule's counts
    are the records' (every write to it is one conditional or row-locked UPDATE)."""
    agent = JobAgentFactory()
    schedule = schedules.create_schedule(workspace=agent.workspace, name="s",
                                         cron_expr="* * * * *", job_agent=agent, job={},
                                         overlap="allow", catchup_window_seconds=600)
    first = db_now().replace(second=0, microsecond=0) - dt.timedelta(minutes=5)
    Schedule.objects.update(next_fire_at=first)

    def act(i, barrier):
        barrier.wait()
        if i % 3 == 0:
            return ("loop", service.run_once(1)["fired"])
        if i == 1:
            schedules.update_schedule(schedule.id, workspace_id=agent.workspace_id,
                                      paused=True)
            return ("pause", 0)
        made = schedules.trigger_schedule(schedule.id, workspace_id=agent.workspace_id)
        return ("trigger", int(made.created))

    results = run_threads(act, 9)
    triggers = sum(n for kind, n in results if kind == "trigger")
    fired = sum(n for kind, n in results if kind == "loop")
    assert triggers == 5
    assert Job.objects.filter(schedule_id=schedule.id).count() == triggers + fired
    fire_times = list(ScheduleFire.objects.filter(trigger=False)
                      .values_list("fire_time", flat=True))
    assert len(fire_times) == len(set(fire_times)) == fired <= 6
    assert Job.objects.filter(schedule_id=schedule.id,
                              scheduled_for__in=fire_times).count() == fired
    schedule.refresh_from_db()
    assert schedule.paused_at is not None
    assert schedule.fired == ScheduleFire.objects.filter(outcome="fired").count() \
        == triggers + fired
    final_state_is_consistent()
