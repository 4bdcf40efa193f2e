"""Shapes of the schedules endpoints (agents/views/schedules.py): a schedule's create and
change bodies (its `job` is POST jobs' own body, JobCreateInput, checked by the same fields),
the schedule as its producer reads it (its `job` without the dispatch_context, whose keys
only are shown, as a job's detail shows them), and its page."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from jobqueue import cron as cron_rules
from jobqueue.lifecycle import schedules
from jobqueue.models import Schedule

from .fields import (
    ApiInput,
    StrictBooleanField,
    StrictCharField,
    StrictChoiceField,
    StrictIntegerField,
    page_of,
)
from .jobs import JobAgentConfigField, JobCreateInput

_CRON_HELP = ("Five fields (minute hour day-of-month month day-of-week), read as Debian cron "
             "reads them, in `timezone` (e.g. \"30 2 * * *\"). One that does not parse or "
             "never fires is a 400.")
_TIMEZONE_HELP = "An IANA time zone (default UTC), e.g. Europe/Berlin."
_OVERLAP_HELP = ("What a fire does while the schedule's jobs run: skip (default): nothing while "
                "its previous job is live (recorded skipped); buffer_one: nothing while one "
                "of its jobs waits unclaimed; allow: always a new job.")
_CATCHUP_HELP = ("How late (seconds, 0 to 604800; default 60) a fire time may be made up "
                "after maintenance was stopped; later, it is recorded missed.")


class ScheduleJobInput(JobCreateInput):
    """A schedule's `job`: POST jobs' body, validated by its fields. Its unknown fields are
    refused without their names (an error names the body's own fields only at the top: a
    name inside `job` is the client's text)."""

    class Meta:
        ref_name = "ScheduleJobCreate"

    def _unknown(self, names: list) -> dict:
        return {"non_field_errors": [
            f"{len(names)} unknown field(s); this body takes " + ", ".join(sorted(self.fields))
            + "."]}


class ScheduleCreateInput(ApiInput):
    name = StrictCharField(min_length=1, max_length=schedules.MAX_NAME_LENGTH,
                           trim_whitespace=False, help_text="Unique in the workspace.")
    cron = StrictCharField(min_length=1, max_length=cron_rules.MAX_CRON_LENGTH,
                           trim_whitespace=False, help_text=_CRON_HELP)
    timezone = StrictCharField(required=False, default="UTC", min_length=1,
                               max_length=cron_rules.MAX_TIMEZONE_LENGTH, help_text=_TIMEZONE_HELP)
    job = ScheduleJobInput(help_text="The job each fire creates: the body of POST jobs "
                         "(expires_at excepted: one instant cannot serve every fire).")
    overlap = StrictChoiceField(choices=list(Schedule.OVERLAPS), required=False,
                                default=Schedule.OVERLAP_SKIP, help_text=_OVERLAP_HELP)
    catchup_window_seconds = StrictIntegerField(
        required=False, default=schedules.DEFAULT_CATCHUP_WINDOW_SECONDS, min_value=0,
        max_value=schedules.MAX_CATCHUP_WINDOW_SECONDS, help_text=_CATCHUP_HELP)
    paused = StrictBooleanField(required=False, default=False,
                                help_text="Create it paused: it fires nothing until resumed.")

    class Meta:
        ref_name = "ScheduleCreate"


class ScheduleUpdateInput(ApiInput):
    name = StrictCharField(required=False, min_length=1, max_length=schedules.MAX_NAME_LENGTH,
                           trim_whitespace=False)
    cron = StrictCharField(required=False, min_length=1, max_length=cron_rules.MAX_CRON_LENGTH,
                           trim_whitespace=False, help_text=_CRON_HELP)
    timezone = StrictCharField(required=False, min_length=1,
                               max_length=cron_rules.MAX_TIMEZONE_LENGTH, help_text=_TIMEZONE_HELP)
    job = ScheduleJobInput(required=False, help_text="A whole new job body (as POST jobs).")
    overlap = StrictChoiceField(choices=list(Schedule.OVERLAPS), required=False,
                                help_text=_OVERLAP_HELP)
    catchup_window_seconds = StrictIntegerField(
        required=False, min_value=0, max_value=schedules.MAX_CATCHUP_WINDOW_SECONDS,
        help_text=_CATCHUP_HELP)
    paused = StrictBooleanField(
        required=False, help_text="true pauses it; false resumes it, from its next fire time "
        "after now (what it would have fired while paused is not made up).")

    class Meta:
        ref_name = "ScheduleUpdate"


class ScheduleJobSerializer(serializers.Serializer):
    """A schedule's job as it is shown: the fields it was given, and the keys of its
    dispatch_context (never the values)."""

    job_agent_id = serializers.UUIDField(
        allow_null=True, help_text="The job agent its jobs target (null: they target labels).")
    labels = serializers.ListField(child=serializers.CharField(), required=False)
    job_agent_config = JobAgentConfigField(required=False)
    priority = serializers.IntegerField(required=False)
    max_attempts = serializers.IntegerField(required=False)
    delay_seconds = serializers.IntegerField(required=False)
    retry_backoff_seconds = serializers.IntegerField(required=False)
    max_runtime_seconds = serializers.IntegerField(required=False)
    external_id = serializers.CharField(required=False, allow_blank=True)
    hold = serializers.BooleanField(required=False)
    group = serializers.CharField(required=False)
    unique_key = serializers.CharField(required=False)
    unique_states = serializers.ListField(child=serializers.CharField(), required=False)
    on_conflict = serializers.CharField(required=False)
    debounce_seconds = serializers.IntegerField(required=False)
    debounce_max_seconds = serializers.IntegerField(required=False)
    concurrency_key = serializers.CharField(required=False)
    concurrency_limit = serializers.IntegerField(required=False)
    rate_limit_key = serializers.CharField(required=False)
    fairness_key = serializers.CharField(required=False)
    dispatch_context_keys = serializers.ListField(child=serializers.CharField())

    class Meta:
        ref_name = "ScheduleJob"

    def to_representation(self, schedule):
        shown = {k: v for k, v in schedule.job.items() if k != "dispatch_context"}
        context = schedule.job.get("dispatch_context") or {}
        agent = None if schedule.job_agent_id is None else str(schedule.job_agent_id)
        return {"job_agent_id": agent, **shown,
                "dispatch_context_keys": sorted(str(k) for k in context)}


class ScheduleFiresSerializer(serializers.Serializer):
    fired = serializers.IntegerField()
    skipped = serializers.IntegerField()
    missed = serializers.IntegerField()

    class Meta:
        ref_name = "ScheduleFires"


class ScheduleSerializer(serializers.Serializer):
    """A schedule. `next_fire_times` is set by the view (schedule.next_fire_times)."""

    id = serializers.UUIDField()
    name = serializers.CharField()
    cron = serializers.CharField()
    timezone = serializers.CharField()
    job = serializers.SerializerMethodField()
    overlap = serializers.ChoiceField(choices=list(Schedule.OVERLAPS))
    catchup_window_seconds = serializers.IntegerField()
    paused = serializers.SerializerMethodField()
    paused_at = serializers.DateTimeField(allow_null=True)
    next_fire_times = serializers.ListField(
        child=serializers.DateTimeField(),
        help_text="The next 5 fire times, in UTC (while paused: where it would fire once "
        "resumed).")
    last_fire_at = serializers.DateTimeField(
        allow_null=True, help_text="The latest fire time handled (a trigger's included).")
    last_job_id = serializers.UUIDField(
        allow_null=True, help_text="The schedule's latest job (a trigger's included).")
    fires = serializers.SerializerMethodField(help_text="Fire times handled, by outcome.")
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()

    class Meta:
        ref_name = "Schedule"

    @extend_schema_field(ScheduleJobSerializer)
    def get_job(self, schedule):
        return ScheduleJobSerializer().to_representation(schedule)

    def get_paused(self, schedule) -> bool:
        return schedule.paused_at is not None

    @extend_schema_field(ScheduleFiresSerializer)
    def get_fires(self, schedule):
        return {"fired": schedule.fired, "skipped": schedule.skipped, "missed": schedule.missed}


SchedulePage = page_of(ScheduleSerializer, "SchedulePage")
