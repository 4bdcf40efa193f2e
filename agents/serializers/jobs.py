"""Shapes of the jobs endpoints (agents/views/jobs.py): a job as its producer sees it (the
list's summary, the job, its detail with the current claim, events and attempts), the create
body, and what the agent holding a job's claim sends about it (heartbeat, status, release)
and reads back (its claim's state).

`dispatch_context` appears in exactly one output shape, ClaimedJobSerializer
(agents/serializers/job_agents.py), which only the claim views render. Every job shape here
leaves it out (the detail shows its keys only).
"""

from __future__ import annotations

import uuid

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from jobqueue import states
from jobqueue.lifecycle import dependencies, inputs

from .fields import (
    INT32_MAX,
    ApiInput,
    StrictBooleanField,
    StrictCharField,
    StrictChoiceField,
    StrictIntegerField,
    StrictUUIDField,
    labels_field,
    page_of,
)

# --- jobs (output) ------------------------------------------------------------------------


@extend_schema_field(
    {"type": "object", "additionalProperties": {},
     "description": "How the job agent runs the job: any JSON object, e.g. "
                    '{"command": ["make", "deploy"]}.'},
    component_name="JobAgentConfig",
)
class JobAgentConfigField(serializers.DictField):
    """A job's job_agent_config. Its own schema component, so that a generated client has one
    JobAgentConfig model rather than one per shape (JobJobAgentConfig, ...)."""


@extend_schema_field(
    {"type": "object", "additionalProperties": {},
     "description": "The execution snapshot: any JSON object; may hold secrets."},
    component_name="DispatchContext",
)
class DispatchContextField(serializers.DictField):
    """A job's dispatch_context (its own schema component, as JobAgentConfigField)."""


class JobSummarySerializer(serializers.Serializer):
    """A job in the producer's list (GET jobs): small whatever the job holds. It leaves out
    what a job may hold in bulk (job_agent_config, result, message; dispatch_context is
    never shown): GET jobs/{job_id} has them."""

    id = serializers.UUIDField()
    workspace_id = serializers.UUIDField()
    job_agent_id = serializers.UUIDField(
        allow_null=True, help_text="The job agent it targets; for a labelled job, the agent "
        "that claimed it last (null until its first claim).")
    labels = serializers.ListField(
        child=serializers.CharField(), allow_null=True,
        help_text="A labelled job's target: any agent of the workspace whose labels include "
        "all of these may claim it. null for a job that targets one job agent.")
    status = serializers.ChoiceField(choices=states.CHOICES)
    external_id = serializers.CharField(allow_blank=True)
    group = serializers.CharField(allow_null=True)
    attempt = serializers.IntegerField()
    max_attempts = serializers.IntegerField()
    priority = serializers.IntegerField()
    retry_backoff_seconds = serializers.IntegerField(source="effective_retry_backoff_seconds")
    max_runtime_seconds = serializers.IntegerField(allow_null=True)
    expires_at = serializers.DateTimeField(allow_null=True)
    available_at = serializers.DateTimeField()
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    completed_at = serializers.DateTimeField(allow_null=True)
    updated_at = serializers.DateTimeField()
    idempotency_key = serializers.CharField(allow_null=True)
    unique_key = serializers.CharField(allow_null=True)
    concurrency_key = serializers.CharField(
        allow_null=True, help_text="The job is claimable only while fewer than its "
        "concurrency_limit of the workspace's jobs with this key are in_progress (null: no "
        "key).")
    concurrency_limit = serializers.IntegerField(
        allow_null=True, help_text="How many of the workspace's jobs with the "
        "concurrency_key may be in_progress at once (null for a job without a key).")
    rate_limit_key = serializers.CharField(
        allow_null=True, help_text="The job is claimed only while its key's rate limit "
        "(PUT rate-limits/{key}), if one is set, lets a claim through (null: no key).")
    fairness_key = serializers.CharField(
        allow_null=True, help_text="The claims of jobs with fairness keys are shared among "
        "the keys in proportion to their weights (PUT fairness-keys/{key}; 1 without one), "
        "whatever number of jobs each has queued (null: no key).")
    schedule_id = serializers.UUIDField(
        allow_null=True, help_text="The schedule whose fire made the job (null: none).")
    scheduled_for = serializers.DateTimeField(
        allow_null=True, help_text="That fire's time (a trigger's: when it was asked).")
    waiting_on = serializers.SerializerMethodField(
        help_text="While the job waits for its dependencies (pending): the ids of those not "
        "yet successful. [] otherwise.")

    class Meta:
        ref_name = "JobSummary"

    def get_waiting_on(self, job) -> list[uuid.UUID]:
        return dependencies.waiting_on(job)


class JobSerializer(JobSummarySerializer):
    """The job object. Never carries dispatch_context."""

    job_agent_config = JobAgentConfigField()
    result = serializers.JSONField(
        allow_null=True, help_text="At most JOBQUEUE_MAX_RESULT_BYTES (1 MiB) as JSON."
    )
    message = serializers.CharField(
        allow_blank=True, help_text="At most JOBQUEUE_MAX_MESSAGE_BYTES (64 KiB) as UTF-8."
    )
    depends_on = serializers.SerializerMethodField(
        help_text="The jobs this one depends on (depends_on, or a flow's depends_on_refs); "
        "[] for a job without dependencies.")

    class Meta:
        ref_name = "Job"

    def get_depends_on(self, job) -> list[uuid.UUID]:
        return [p["job_id"] for p in dependencies.parents(job)]


class JobCreatedSerializer(JobSerializer):
    """POST jobs' answer: the job, and whether a unique_key met a live job (200) instead of
    creating one (201)."""

    deduplicated = serializers.BooleanField(
        help_text="true: a live job with the unique_key was answered (unchanged, or replaced "
        "in place); false: the job was created (or this is an Idempotency-Key replay).")

    class Meta:
        ref_name = "JobCreated"


class ClaimStateSerializer(serializers.Serializer):
    """The current lease, without its claim_id."""

    attempt = serializers.IntegerField()
    claimed_at = serializers.DateTimeField()
    claim_expires_at = serializers.DateTimeField()
    lease_seconds = serializers.IntegerField()
    heartbeat_at = serializers.DateTimeField(allow_null=True)
    lease_state = serializers.SerializerMethodField(
        help_text="`active`, or `expired` (past its expiry, not yet reaped)."
    )

    class Meta:
        ref_name = "ClaimState"

    def get_lease_state(self, claim) -> str:
        now = self.context.get("db_now")
        return "expired" if now is not None and claim.claim_expires_at <= now else "active"


class EventSerializer(serializers.Serializer):
    kind = serializers.CharField()
    attempt = serializers.IntegerField()
    actor = serializers.CharField(allow_blank=True)
    detail = serializers.DictField()
    created_at = serializers.DateTimeField()
    count = serializers.IntegerField(
        help_text="How many occurrences the event stands for: 1, except for "
        "stale_write_refused, recorded once per attempt, operation and code."
    )
    last_at = serializers.DateTimeField(
        allow_null=True, help_text="The latest occurrence when count > 1, else null."
    )

    class Meta:
        ref_name = "JobEvent"


class AttemptSerializer(serializers.Serializer):
    """One attempt, derived from the job's timeline."""

    number = serializers.IntegerField()
    claimed_at = serializers.DateTimeField()
    ended_at = serializers.DateTimeField(allow_null=True, help_text="null while it runs.")
    outcome = serializers.ChoiceField(
        choices=["successful", "failure", "cancelled", "retrying", "released", "reaped",
                 "timed_out", "superseded"],
        allow_null=True, help_text="How it ended (null while it runs).",
    )
    message = serializers.CharField(
        allow_blank=True,
        help_text="The report's message (its first 200 characters), the release's reason, or "
        "why the service ended it.",
    )

    class Meta:
        ref_name = "Attempt"


class JobDetailSerializer(JobSerializer):
    dispatch_context_keys = serializers.SerializerMethodField()
    claim = serializers.SerializerMethodField()
    events = serializers.SerializerMethodField()
    attempts = serializers.SerializerMethodField()

    class Meta:
        ref_name = "JobDetail"

    def get_dispatch_context_keys(self, job) -> list[str]:
        ctx = job.dispatch_context
        return sorted(str(k) for k in ctx) if isinstance(ctx, dict) else []

    @extend_schema_field(ClaimStateSerializer(allow_null=True))
    def get_claim(self, job):
        claim = self.context.get("claim")
        return ClaimStateSerializer(claim, context=self.context).data if claim else None

    @extend_schema_field(EventSerializer(many=True))
    def get_events(self, job):
        return EventSerializer(self.context.get("events", []), many=True).data

    @extend_schema_field(AttemptSerializer(many=True))
    def get_attempts(self, job):
        return AttemptSerializer(self.context.get("attempts", []), many=True).data


# The producer list loads only what it shows (never the bulky columns).
JOB_LIST_ONLY = ["id", "workspace_id", "job_agent_id", "labels", "status", "external_id", "group",
                 "attempt",
                 "max_attempts", "priority", "available_at", "created_at", "started_at",
                 "completed_at", "updated_at", "idempotency_key", "unique_key",
                 "concurrency_key", "concurrency_limit", "rate_limit_key", "fairness_key",
                 "schedule_id",
                 "scheduled_for", "has_parents"]
JobPage = page_of(JobSummarySerializer, "JobPage")


# --- create -------------------------------------------------------------------------------


class JobCreateInput(ApiInput):
    # Exactly one of the two (validate): the job's target.
    job_agent_id = StrictUUIDField(
        required=False, help_text="The one job agent that may claim the job. Exactly one of "
        "job_agent_id and labels.")
    labels = labels_field(
        inputs.MAX_JOB_LABELS, required=False, allow_empty=False,
        help_text="1 to 16 labels (each 1 to 63 characters of A-Z a-z 0-9 . _ : = / -): any "
        "job agent of the workspace whose labels include all of them may claim the job. "
        "Exactly one of job_agent_id and labels.")
    job_agent_config = JobAgentConfigField(required=False, default=dict)
    dispatch_context = DispatchContextField(
        required=False, default=dict,
        help_text="Execution snapshot; may hold secrets. Returned only to the claimer.",
    )
    priority = StrictIntegerField(
        required=False, default=0, min_value=-INT32_MAX, max_value=INT32_MAX
    )
    max_attempts = StrictIntegerField(
        required=False, allow_null=True, min_value=1, max_value=INT32_MAX,
        rule=inputs.max_attempts,
    )
    delay_seconds = StrictIntegerField(
        required=False, allow_null=True, min_value=0, max_value=inputs.MAX_DELAY_SECONDS
    )
    retry_backoff_seconds = StrictIntegerField(
        required=False, allow_null=True, min_value=0, max_value=INT32_MAX,
        rule=inputs.retry_backoff_seconds,
        help_text="The wait before the first retry of a retryable failure, doubled per "
        "attempt (default JOBQUEUE_RETRY_BACKOFF_SECONDS; at most "
        "JOBQUEUE_MAX_RETRY_BACKOFF_SECONDS).",
    )
    max_runtime_seconds = StrictIntegerField(
        required=False, allow_null=True, min_value=1, max_value=INT32_MAX,
        rule=inputs.max_runtime_seconds,
        help_text="How long one attempt may run from its claim, heartbeats or not (default: "
        "the job agent's, else no limit; bounded by JOBQUEUE_MIN_MAX_RUNTIME_SECONDS.."
        "JOBQUEUE_MAX_MAX_RUNTIME_SECONDS). Past it the attempt ends: queued again while "
        "attempts remain, else expired.",
    )
    expires_at = serializers.DateTimeField(
        required=False, allow_null=True,
        help_text="When the whole job must be finished (in the future, at most "
        "JOBQUEUE_MAX_EXPIRES_IN_SECONDS ahead). Past it the job is never claimed and ends "
        "expired, running or not.",
    )
    external_id = StrictCharField(
        required=False, allow_blank=True, default="", max_length=255, trim_whitespace=False
    )
    hold = StrictBooleanField(
        required=False, default=False, help_text="Create as `pending`: dispatch it later."
    )
    group = StrictCharField(
        required=False, allow_null=True, min_length=1, max_length=200, trim_whitespace=False,
        help_text='The job\'s group (a run): 1 to 200 printable characters without "/", and '
        'not "." or "..". '
        "A cancelled group takes no new jobs (409 group_cancelled).",
    )
    # Unique jobs and debounce (docs/api.md): the rules between these fields are the
    # lifecycle's (jobqueue.lifecycle.inputs.uniqueness), each a 400 naming its field.
    unique_key = StrictCharField(
        required=False, allow_null=True, min_length=1, max_length=inputs.MAX_UNIQUE_KEY_LENGTH,
        trim_whitespace=False,
        help_text="While a job of the workspace with this key is live, a create with it makes "
        "no other job: 200 with the live one and deduplicated true.",
    )
    unique_states = serializers.ListField(
        child=StrictChoiceField(choices=sorted(states.ACTIVE)), required=False,
        allow_null=True, allow_empty=False, max_length=len(states.ACTIVE),
        help_text="The statuses that count as live for this create (default: all three).",
    )
    on_conflict = StrictChoiceField(
        choices=list(inputs.ON_CONFLICT), required=False, allow_null=True,
        help_text="skip (default): answer the live job unchanged. replace: update an "
        "unclaimed one in place (dispatch_context, priority, available_at); beside an "
        "in_progress one, create a new job. A live job of another job agent is never "
        "replaced: 409 unique_key_conflict.",
    )
    debounce_seconds = StrictIntegerField(
        required=False, allow_null=True, min_value=1, max_value=inputs.MAX_DEBOUNCE_SECONDS,
        help_text="With unique_key: the job waits this long after the last create that met it "
        "queued (which also gives it its dispatch_context), never past the cap its first "
        "create stored nor past the last start before its expires_at (expires_at less its "
        "max_runtime_seconds, else less debounce_seconds). A live job of another job agent "
        "is never pushed: 409 unique_key_conflict.",
    )
    debounce_max_seconds = StrictIntegerField(
        required=False, allow_null=True, min_value=1,
        max_value=inputs.MAX_DEBOUNCE_MAX_SECONDS,
        help_text="With debounce_seconds (and at least it): no push past this long after the "
        "job's first create. Stored on the job by the create that makes it; later creates' "
        "own values (or their absence) change nothing.",
    )
    # Concurrency keys (docs/api.md): the rule between the two is the lifecycle's
    # (jobqueue.lifecycle.inputs.concurrency), a 400 naming its field.
    concurrency_key = StrictCharField(
        required=False, allow_null=True, min_length=1,
        max_length=inputs.MAX_CONCURRENCY_KEY_LENGTH, trim_whitespace=False,
        help_text="1 to 255 printable characters: the job is claimable only while fewer than "
        "its concurrency_limit of the workspace's jobs with this key are in_progress.",
    )
    concurrency_limit = StrictIntegerField(
        required=False, allow_null=True, min_value=1, max_value=inputs.MAX_CONCURRENCY_LIMIT,
        help_text="With concurrency_key: how many of the workspace's jobs with the key may be "
        "in_progress at once (1 to 1000, default 1).",
    )
    # Rate limits (docs/api.md): the key's rule is the lifecycle's
    # (jobqueue.lifecycle.inputs.rate_limit_key), a 400 naming the field.
    rate_limit_key = StrictCharField(
        required=False, allow_null=True, min_length=1,
        max_length=inputs.MAX_RATE_LIMIT_KEY_LENGTH, trim_whitespace=False,
        help_text="1 to 255 printable characters: the job is claimed only while fewer than "
        "its key's rate limit count (PUT rate-limits/{key}) of the workspace's jobs with this "
        "key were claimed in the limit's last period_seconds; a key without a limit limits "
        "nothing.",
    )
    # Fair shares (docs/api.md): the key's rule is the lifecycle's
    # (jobqueue.lifecycle.inputs.fairness_key), a 400 naming the field.
    fairness_key = StrictCharField(
        required=False, allow_null=True, min_length=1,
        max_length=inputs.MAX_RATE_LIMIT_KEY_LENGTH, trim_whitespace=False,
        help_text="1 to 255 printable characters (e.g. a tenant): the claims of the "
        "workspace's jobs with fairness keys are shared among the keys in proportion to their "
        "weights (PUT fairness-keys/{key}; 1 without one), whatever number of jobs each has "
        "queued; priority outranks it.",
    )
    depends_on = serializers.ListField(
        child=StrictUUIDField(), required=False, allow_null=True, allow_empty=False,
        max_length=inputs.MAX_DEPENDENCIES,
        help_text="1 to 100 jobs of the workspace (a repeated id counts once): the job waits "
        "pending until they are all successful, then is queued; when one ends failure, "
        "cancelled or expired, it ends cancelled (dependency_failed). Not with hold.",
    )

    class Meta:
        ref_name = "JobCreate"

    def validate(self, attrs):
        if ("job_agent_id" in attrs) == ("labels" in attrs):
            raise serializers.ValidationError(
                {"job_agent_id": ["Give exactly one of job_agent_id and labels."]})
        return attrs


class FlowJobInput(JobCreateInput):
    """One job of a flow: POST jobs' fields (but hold and the unique-job ones), its ref, and
    the earlier jobs of the flow it depends on."""

    hold = None
    unique_key = None
    unique_states = None
    on_conflict = None
    debounce_seconds = None
    debounce_max_seconds = None
    ref = StrictCharField(
        min_length=1, max_length=200, trim_whitespace=False,
        help_text="The job's name in the flow (unique in it): the answer's key, and what "
        "later jobs name in depends_on_refs.")
    depends_on_refs = serializers.ListField(
        child=StrictCharField(min_length=1, max_length=200, trim_whitespace=False),
        required=False, default=list, max_length=inputs.MAX_DEPENDENCIES,
        help_text="Refs of earlier jobs of the flow this one depends on (so no cycle can be "
        "written); with depends_on, at most 100 in all.")

    class Meta:
        ref_name = "FlowJobCreate"


class FlowCreateInput(ApiInput):
    jobs = serializers.ListField(child=FlowJobInput(), min_length=1, max_length=1000)

    class Meta:
        ref_name = "FlowCreate"


class FlowCreatedSerializer(serializers.Serializer):
    jobs = serializers.DictField(
        child=JobSerializer(),
        help_text="The flow's jobs by ref, in the order sent.")

    class Meta:
        ref_name = "FlowCreated"


# --- the claim holder: its claim's state, its writes --------------------------------------


class ClaimCheckSerializer(serializers.Serializer):
    """A claim's state, read-only. Current claims carry attempt, lease_state and
    claim_expires_at; others carry code (and final_status when the claim ended the job)."""

    current = serializers.BooleanField()
    server_time = serializers.DateTimeField(help_text="The database's clock.")
    attempt = serializers.IntegerField(required=False)
    lease_state = serializers.ChoiceField(
        choices=["active", "expired"], required=False,
        help_text="`expired`: past its expiry, not yet reaped (a terminal report or a release "
        "is still accepted; a heartbeat is not).",
    )
    claim_expires_at = serializers.DateTimeField(required=False)
    code = serializers.ChoiceField(
        choices=["claim_superseded", "deadline_exceeded", "job_cancelled", "job_finished"],
        required=False,
        help_text="The 409 code a write with this claim_id would get.",
    )
    final_status = serializers.ChoiceField(
        choices=sorted(states.TERMINAL), required=False,
        help_text="The job's final status, when this claim's own report ended it.",
    )

    class Meta:
        ref_name = "ClaimCheck"

    def to_representation(self, check):
        body = {"current": check.current, "server_time": check.server_time}
        if check.current:
            body.update(attempt=check.attempt, lease_state=check.lease_state,
                        claim_expires_at=check.claim_expires_at)
        else:
            body["code"] = check.code
            if check.final_status is not None:
                body["final_status"] = check.final_status
        return {k: (self.fields[k].to_representation(v) if v is not None else v)
                for k, v in body.items()}


CHECKPOINT_HELP = ("Any JSON (not null), up to JOBQUEUE_MAX_CHECKPOINT_BYTES (64 KiB): "
                   "saved for the next attempt, which gets it as `claim.checkpoint`.")


class HeartbeatInput(ApiInput):
    claim_id = StrictUUIDField()
    checkpoint = serializers.JSONField(required=False, allow_null=True,
                                       help_text=CHECKPOINT_HELP)

    class Meta:
        ref_name = "Heartbeat"


class HeartbeatResponseSerializer(serializers.Serializer):
    job_id = serializers.UUIDField()
    claim_expires_at = serializers.DateTimeField()
    server_time = serializers.DateTimeField()

    class Meta:
        ref_name = "HeartbeatResponse"


class StatusInput(ApiInput):
    claim_id = StrictUUIDField()
    status = StrictChoiceField(choices=sorted(states.REPORTABLE))
    message = StrictCharField(
        required=False, allow_blank=True, trim_whitespace=False,
        help_text="At most JOBQUEUE_MAX_MESSAGE_BYTES (default 64 KiB) in UTF-8; beyond is a "
        "400 validation_error that changes nothing.",
    )
    result = serializers.JSONField(
        required=False, allow_null=True,
        help_text="At most JOBQUEUE_MAX_RESULT_BYTES (default 1 MiB) as compact JSON; beyond "
        "is a 400 validation_error that changes nothing.",
    )
    external_id = StrictCharField(
        required=False, allow_blank=True, max_length=255, trim_whitespace=False
    )
    checkpoint = serializers.JSONField(required=False, allow_null=True,
                                       help_text="Progress reports only. " + CHECKPOINT_HELP)
    retry = StrictBooleanField(
        required=False, default=False,
        help_text="With status `failure`: a retryable failure. While attempts remain the job "
        "goes back to `queued`, claimable after an exponential backoff; on the last attempt "
        "it ends `failure`.",
    )

    class Meta:
        ref_name = "StatusReport"


class ReleaseInput(ApiInput):
    claim_id = StrictUUIDField()
    reason = StrictCharField(required=False, allow_blank=True, max_length=500)
    retry_after_seconds = StrictIntegerField(
        required=False, min_value=0, max_value=INT32_MAX, rule=inputs.retry_after_seconds,
        help_text="Keep the job unclaimable this long (bounded by "
        "JOBQUEUE_MAX_RETRY_AFTER_SECONDS).",
    )

    class Meta:
        ref_name = "Release"
