"""Schedules: create, change, pause, trigger and delete them; and fire the due ones (the batch
of maintenance's `schedules` service, maintenance/schedules.py). docs/api.md, "Schedules".

A fire makes its job through create_job, as POST jobs does, with the schedule's `job` (the
body of POST jobs but job_agent_id) and the fire's `schedule_id` and `scheduled_for`; nothing
here touches a job after its creation, so a scheduled job's claim and reports are a plain
job's.

At most once per fire time, whatever the number of maintenance loops: the batch takes the
due schedules FOR UPDATE SKIP LOCKED (PostgreSQL), advances each one's `next_fire_at` with a
conditional UPDATE (`WHERE next_fire_at =` the time it read: a loop that lost the race
updates nothing and fires nothing, SQLite included), and records each fire time in
schedule_fire, whose unique (schedule, fire_time) constraint refuses a second record (and
rolls back that fire's jobs with it).
"""

from __future__ import annotations

import datetime as dt

from django.db import IntegrityError, transaction
from django.db.models import F
from django.db.models.functions import Now

from jobqueue import cron, states
from jobqueue.conf import jobqueue_settings
from jobqueue.db import db_now
from jobqueue.exceptions import Conflict, InvalidInput, NotFound
from jobqueue.models import Job, JobAgent, Schedule, ScheduleFire

from . import inputs
from .create import create_job
from .results import JobCreated

MAX_NAME_LENGTH = 200
MAX_CATCHUP_WINDOW_SECONDS = 7 * 86_400
DEFAULT_CATCHUP_WINDOW_SECONDS = 60
NEXT_FIRE_TIMES = 5
# Fire times one schedule handles per transaction (after a long outage, the rest next).
MAX_FIRES_PER_PASS = 1000
# The fields of POST jobs a schedule's `job` keeps (job_agent_id is the schedule's job_agent;
# expires_at, one instant, cannot serve every fire). With `labels` the schedule has no agent.
TEMPLATE_FIELDS = (
    "labels", "job_agent_config", "dispatch_context", "priority", "max_attempts", "delay_seconds",
    "retry_backoff_seconds", "max_runtime_seconds", "external_id", "hold", "group",
    "unique_key", "unique_states", "on_conflict", "debounce_seconds", "debounce_max_seconds",
    "concurrency_key", "concurrency_limit", "rate_limit_key", "fairness_key",
)


def schedule_actor(schedule_id) -> str:
    """The actor on the events of a fire's job."""
    return f"schedule:{schedule_id}"


# --- inputs -------------------------------------------------------------------------------


def _name(value) -> str:
    if (not isinstance(value, str) or not 1 <= len(value) <= MAX_NAME_LENGTH
            or not value.isprintable()):
        raise InvalidInput(f"name must be 1 to {MAX_NAME_LENGTH} printable characters.",
                           field="name")
    return value


def _overlap(value) -> str:
    if value not in Schedule.OVERLAPS:
        raise InvalidInput("overlap must be one of: " + ", ".join(Schedule.OVERLAPS) + ".",
                           field="overlap")
    return value


def _catchup(value) -> int:
    return inputs.bounded_int(value, "catchup_window_seconds", 0, MAX_CATCHUP_WINDOW_SECONDS)


def _template(job: dict) -> dict:
    """A schedule's `job`: the fields of POST jobs it keeps, each checked by the rules a create
    checks (a refusal names `job`, and the field inside it)."""
    if not isinstance(job, dict):
        raise InvalidInput("job must be an object: the body of POST jobs.", field="job")
    if job.get("expires_at") is not None:
        raise InvalidInput("expires_at: a schedule's jobs cannot share one instant; use "
                           "max_runtime_seconds.", field="job")
    unknown = sorted(set(job) - set(TEMPLATE_FIELDS) - {"expires_at"})
    if unknown:
        raise InvalidInput("job takes the fields of POST jobs.", field="job")
    template = {k: v for k, v in job.items() if k in TEMPLATE_FIELDS and v is not None}
    try:
        inputs.max_attempts(template.get("max_attempts"))
        inputs.delay_seconds(template.get("delay_seconds"))
        inputs.retry_backoff_seconds(template.get("retry_backoff_seconds"))
        inputs.max_runtime_seconds(template.get("max_runtime_seconds"))
        inputs.group_name(template.get("group"))
        inputs.uniqueness(template.get("unique_key"), template.get("unique_states"),
                          template.get("on_conflict"), template.get("debounce_seconds"),
                          template.get("debounce_max_seconds"))
        inputs.concurrency(template.get("concurrency_key"), template.get("concurrency_limit"))
        inputs.rate_limit_key(template.get("rate_limit_key"))
        inputs.fairness_key(template.get("fairness_key"))
    except InvalidInput as exc:
        raise InvalidInput(f"{exc.context.get('field')}: {exc.detail}", field="job") from None
    if "unique_states" in template:
        template["unique_states"] = sorted(template["unique_states"])
    return template


# --- the producer's calls -----------------------------------------------------------------


def _target(job_agent: JobAgent | None, job: dict, workspace_id) -> None:
    """A schedule's jobs target its agent or the labels of its `job`: exactly one."""
    if (job_agent is None) == (job.get("labels") is None):
        raise InvalidInput("A schedule's job targets exactly one of job_agent_id and labels.",
                           field="job")
    if job_agent is None:
        inputs.job_labels(job["labels"])
    elif job_agent.workspace_id != workspace_id:
        raise NotFound("No such job agent.")


def create_schedule(*, workspace, name: str, cron_expr: str, job_agent: JobAgent, job: dict,
                    timezone: str = "UTC", overlap: str = Schedule.OVERLAP_SKIP,
                    catchup_window_seconds: int = DEFAULT_CATCHUP_WINDOW_SECONDS,
                    paused: bool = False) -> Schedule:
    """A new schedule; its first fire is the first fire time after now (the database's). Its
    jobs target `job_agent` or the `labels` of `job`, exactly one."""
    job = _template(job)
    _target(job_agent, job, workspace.id)
    tz = cron.timezone(timezone)
    now = db_now()
    schedule = Schedule(
        workspace=workspace, name=_name(name), cron=cron.check(cron_expr, tz, now),
        timezone=timezone, job_agent=job_agent, job=job, overlap=_overlap(overlap),
        catchup_window_seconds=_catchup(catchup_window_seconds),
        paused_at=now if paused else None, next_fire_at=cron.next_after(cron_expr, tz, now),
    )
    try:
        with transaction.atomic():
            schedule.save(force_insert=True)
    except IntegrityError as exc:
        raise InvalidInput("A schedule with this name already exists.", field="name") from exc
    schedule.refresh_from_db()
    return schedule


def get_schedule(schedule_id, *, workspace_id) -> Schedule:
    schedule = Schedule.objects.filter(id=schedule_id, workspace_id=workspace_id).first()
    if schedule is None:
        raise NotFound("No such schedule.")
    return schedule


def update_schedule(schedule_id, *, workspace_id, job_agent: JobAgent | None = None,
                    **changes) -> Schedule:
    """Change a schedule: `name`, `cron`, `timezone`, `job` (with `job_agent`), `overlap`,
    `catchup_window_seconds`, `paused`. A new cron or time zone, and a resume, fire next at
    the first fire time after now: what a paused schedule would have fired is not made up."""
    with transaction.atomic():
        schedule = (Schedule.objects.select_for_update()
                    .filter(id=schedule_id, workspace_id=workspace_id).first())
        if schedule is None:
            raise NotFound("No such schedule.")
        now = db_now()
        fields = {"updated_at": Now()}
        if "name" in changes:
            fields["name"] = _name(changes["name"])
        if "overlap" in changes:
            fields["overlap"] = _overlap(changes["overlap"])
        if "catchup_window_seconds" in changes:
            fields["catchup_window_seconds"] = _catchup(changes["catchup_window_seconds"])
        if "job" in changes:
            fields["job"] = _template(changes["job"])
            _target(job_agent, fields["job"], workspace_id)
            fields["job_agent"] = job_agent
        timezone = changes.get("timezone", schedule.timezone)
        expr = changes.get("cron", schedule.cron)
        tz = cron.timezone(timezone)
        if "cron" in changes:
            fields["cron"] = cron.check(expr, tz, now)
        if "timezone" in changes:
            fields["timezone"] = timezone
        paused = changes.get("paused")
        resumed = paused is False and schedule.paused_at is not None
        if paused and schedule.paused_at is None:
            fields["paused_at"] = now
        elif resumed:
            fields["paused_at"] = None
        if resumed or "cron" in changes or "timezone" in changes:
            fields["next_fire_at"] = cron.next_after(expr, tz, now)
        try:
            with transaction.atomic():
                Schedule.objects.filter(id=schedule.id).update(**fields)
        except IntegrityError as exc:
            raise InvalidInput("A schedule with this name already exists.",
                               field="name") from exc
    schedule.refresh_from_db()
    return schedule


def delete_schedule(schedule_id, *, workspace_id) -> None:
    """Delete a schedule and its fires' records; its jobs stay (with its schedule_id)."""
    deleted, _ = Schedule.objects.filter(id=schedule_id, workspace_id=workspace_id).delete()
    if not deleted:
        raise NotFound("No such schedule.")


def trigger_schedule(schedule_id, *, workspace_id, actor: str = "") -> JobCreated:
    """Fire now, paused or not, whatever the overlap policy: a job (its scheduled_for the
    database's now) that counts as the schedule's latest. A job the create refuses (its
    group cancelled, say) is the caller's error, and nothing is recorded. A job the schedule's
    unique_key deduplicates is answered as create_job answers it (recorded as skipped)."""
    with transaction.atomic():
        # of=self: job_agent is nullable (a schedule of labelled jobs), an outer join that
        # FOR UPDATE cannot lock.
        schedule = (Schedule.objects.select_for_update(of=("self",))
                    .select_related("workspace", "job_agent")
                    .filter(id=schedule_id, workspace_id=workspace_id).first())
        if schedule is None:
            raise NotFound("No such schedule.")
        now = db_now()
        made = create_job(workspace=schedule.workspace, job_agent=schedule.job_agent,
                          **schedule.job, schedule_id=schedule.id, scheduled_for=now,
                          actor=actor or schedule_actor(schedule.id))
        outcome = ScheduleFire.FIRED if made.created else ScheduleFire.SKIPPED
        ScheduleFire.objects.create(schedule=schedule, fire_time=now, trigger=True,
                                    outcome=outcome, job_id=made.job.id,
                                    detail="" if made.created else "deduplicated")
        Schedule.objects.filter(id=schedule.id).update(
            last_fire_at=now, updated_at=Now(), **{outcome: F(outcome) + 1},
            **({"last_job_id": made.job.id} if made.created else {}))
    return made


def next_fire_times(schedule: Schedule, now: dt.datetime,
                    count: int = NEXT_FIRE_TIMES) -> list[dt.datetime]:
    """The schedule's next `count` fire times, in UTC: from its next fire not yet handled, or,
    while it is paused, those after `now` (where it would fire once resumed)."""
    tz = cron.timezone(schedule.timezone)
    start = schedule.next_fire_at
    if schedule.paused_at is not None or start is None:
        start = cron.next_after(schedule.cron, tz, now)
        if start is None:  # pragma: no cover -- a stored cron fires (checked when set)
            return []
    times = [start]
    for when in cron.fire_times(schedule.cron, tz, start):
        if len(times) == count:
            break
        times.append(when)
    return times


# --- maintenance --------------------------------------------------------------------------


def fire_due_schedules(batch_size: int) -> dict:
    """Fire every due schedule, `batch_size` schedules per transaction: each fire time up to
    now is fired (within the catch-up window), skipped (the overlap policy) or missed (past
    the window). Counts: fire times by outcome, and the schedules handled."""
    counts = {"schedules": 0, ScheduleFire.FIRED: 0, ScheduleFire.SKIPPED: 0,
              ScheduleFire.MISSED: 0}
    while True:
        with transaction.atomic():
            now = db_now()
            due = list(
                Schedule.objects.filter(paused_at__isnull=True, next_fire_at__lte=now)
                .order_by("next_fire_at")
                .select_for_update(skip_locked=True, of=("self",))
                .select_related("workspace", "job_agent")[:batch_size]
            )
            if not due:
                return counts
            for schedule in due:
                with transaction.atomic():
                    outcomes = _fire(schedule, now)
                if outcomes is not None:  # pragma: no branch -- race: another loop fired it
                    counts["schedules"] += 1
                    for outcome in outcomes:
                        counts[outcome] += 1


def _fire(schedule: Schedule, now: dt.datetime) -> list[str] | None:
    """Handle the schedule's fire times up to `now` (at most MAX_FIRES_PER_PASS): their
    outcomes in order, or None when another loop handled them first."""
    tz = cron.timezone(schedule.timezone)
    times = [schedule.next_fire_at]
    following = cron.fire_times(schedule.cron, tz, schedule.next_fire_at)
    upcoming = next(following, None)
    while upcoming is not None and upcoming <= now and len(times) < MAX_FIRES_PER_PASS:
        times.append(upcoming)
        upcoming = next(following, None)
    # A fire time handled already (recorded) is not handled again: its record would break
    # schedule_fire_once and roll back the whole batch's fires, every pass.
    recorded = set(ScheduleFire.objects.filter(schedule_id=schedule.id, fire_time__in=times)
                   .values_list("fire_time", flat=True))
    times = [t for t in times if t not in recorded]
    # The conditional advance: only the loop that reads the current next_fire_at moves it.
    advanced = Schedule.objects.filter(
        id=schedule.id, next_fire_at=schedule.next_fire_at, paused_at__isnull=True,
    ).update(next_fire_at=upcoming, updated_at=Now())
    if not advanced:  # another loop advanced it first (on SQLite, where no row lock skips)
        return None
    late = dt.timedelta(seconds=schedule.catchup_window_seconds
                        + jobqueue_settings()["SCHEDULE_INTERVAL_SECONDS"])
    records, last_job_id = [], schedule.last_job_id
    for when in times:
        if now - when > late:
            records.append(ScheduleFire(schedule=schedule, fire_time=when,
                                        outcome=ScheduleFire.MISSED,
                                        detail="past the catch-up window"))
            continue
        job_id, detail = _fire_once(schedule, when, last_job_id)
        if job_id is not None:
            last_job_id = job_id
        records.append(ScheduleFire(
            schedule=schedule, fire_time=when, job_id=job_id, detail=detail,
            outcome=ScheduleFire.FIRED if job_id is not None else ScheduleFire.SKIPPED))
    ScheduleFire.objects.bulk_create(records)  # schedule_fire_once: the database's guard
    # The records are kept as long as failed jobs are (JOBQUEUE_RETENTION_FAILED_DAYS).
    kept = dt.timedelta(days=jobqueue_settings()["RETENTION_FAILED_DAYS"])
    ScheduleFire.objects.filter(schedule_id=schedule.id, fire_time__lt=now - kept).delete()
    outcomes = [r.outcome for r in records]
    if not times:
        return outcomes
    Schedule.objects.filter(id=schedule.id).update(
        last_fire_at=times[-1], last_job_id=last_job_id,
        **{o: F(o) + outcomes.count(o) for o in ScheduleFire.OUTCOMES if o in outcomes})
    return outcomes


def waiting_jobs(schedule_id):
    """The schedule's jobs that wait unclaimed (pending, queued): what `buffer_one` counts
    (job_schedule_idx)."""
    return Job.objects.filter(schedule_id=schedule_id, status__in=sorted(inputs.UNCLAIMED))


def _fire_once(schedule: Schedule, when: dt.datetime, last_job_id) -> tuple:
    """One fire time within the window: (the job it made, "") or (None, why it made none)."""
    if schedule.overlap == Schedule.OVERLAP_SKIP and last_job_id is not None and (
            Job.objects.filter(id=last_job_id, status__in=states.ACTIVE).exists()):
        return None, "the previous job is live"
    if schedule.overlap == Schedule.OVERLAP_BUFFER_ONE and waiting_jobs(schedule.id).exists():
        return None, "a job is waiting"
    try:
        with transaction.atomic():
            made = create_job(workspace=schedule.workspace, job_agent=schedule.job_agent,
                              **schedule.job, schedule_id=schedule.id, scheduled_for=when,
                              actor=schedule_actor(schedule.id))
    except (InvalidInput, Conflict, NotFound) as exc:
        return None, exc.code
    if not made.created:
        return None, "deduplicated"
    return made.job.id, ""
