"""Request validation and response shapes of the HTTP API (see docs/api.md).

`dispatch_context` appears in exactly one output shape, ClaimedJobSerializer, which only the
claim views render. Every other job shape leaves it out (the detail shows its keys only).
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

from drf_spectacular.utils import extend_schema_field, extend_schema_serializer
from rest_framework import serializers

from jobqueue import fencing, states
from jobqueue.exceptions import InvalidInput
from jobqueue.lifecycle import inputs
from jobqueue.models import JobAgent, WebhookDelivery, WebhookEndpoint

INT32_MAX = 2**31 - 1


class StrictUUIDField(serializers.UUIDField):
    """A UUID given as a string (DRF's field would also take an integer)."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid", value="")
        return super().to_internal_value(data)


class StrictIntegerField(serializers.IntegerField):
    """A JSON integer: DRF's field would also take "5", 5.0 and true. The error names the
    bounds. `rule`, a validator of jobqueue.lifecycle.inputs, checks the bounds that come
    from settings (`limit`, `lease_seconds`, ...) here already, with the lifecycle's message;
    `min_value` and `max_value` are then the outer bounds the schema publishes."""

    def __init__(self, *, rule=None, **kwargs):
        low, high = kwargs.get("min_value"), kwargs.get("max_value")
        messages = {"invalid": "Must be a JSON integer (not a string, a fraction or a boolean)."}
        if low is not None and high is not None:
            messages["min_value"] = messages["max_value"] = (
                f"Must be an integer from {low} to {high}.")
        kwargs["error_messages"] = {**messages, **kwargs.get("error_messages", {})}
        super().__init__(**kwargs)
        self.rule = rule

    def to_internal_value(self, data):
        if not isinstance(data, int) or isinstance(data, bool):
            self.fail("invalid")
        value = super().to_internal_value(data)
        if self.rule is not None:
            try:
                self.rule(value)
            except InvalidInput as exc:
                raise serializers.ValidationError(exc.detail, code="invalid") from None
        return value


class StrictCharField(serializers.CharField):
    """Text given as a string (DRF's field would also take a number)."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    """true or false, as JSON booleans only (DRF's field also takes "yes", 1, "on"...)."""

    def to_internal_value(self, data):
        if not isinstance(data, bool):
            self.fail("invalid", input="")
        return data


class StrictChoiceField(serializers.ChoiceField):
    """A choice whose error names the allowed values, never the value sent (DRF's own
    message quotes it: '"<what you sent>" is not a valid choice.')."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        allowed = ", ".join(str(choice) for choice in self.choices)
        self.error_messages["invalid_choice"] = f"Must be one of: {allowed}."


MAX_UNKNOWN_NAMED = 20


class ApiInput(serializers.Serializer):
    """A request body: a JSON object of the declared fields and no other. A field it does not
    declare is a 400 naming it (a misspelt optional field would otherwise change nothing, and
    nobody would notice), together with the body's other errors."""

    def to_internal_value(self, data):
        unknown = ([key for key in data if key not in self.fields]
                   if isinstance(data, Mapping) else [])
        try:
            value = super().to_internal_value(data)
        except serializers.ValidationError as exc:
            if not unknown or not isinstance(exc.detail, dict):
                raise
            raise serializers.ValidationError({**exc.detail, **self._unknown(unknown)}) from None
        if unknown:
            raise serializers.ValidationError(self._unknown(unknown))
        return value

    def _unknown(self, names: list) -> dict:
        """{name: [message]} for the unknown fields. A name is the one part of a body an error
        quotes, on purpose: up to 20 of them, each if it is 1 to 100 printable characters."""
        message = "Unknown field; this body takes " + ", ".join(sorted(self.fields)) + "."
        shown = [n for n in names if 0 < len(n) <= 100 and n.isprintable()][:MAX_UNKNOWN_NAMED]
        errors = {name: [message] for name in shown}
        if len(shown) < len(names):
            errors["non_field_errors"] = [
                f"{len(names) - len(shown)} more unknown fields (names over 100 characters or "
                f"not printable are not shown, nor more than {MAX_UNKNOWN_NAMED})."]
        return errors


def vocabulary() -> frozenset[str]:
    """The API's own words in request bodies: every field name of every request shape and
    every value a choice field allows. No secret; an error may say them (agents/exceptions.py
    does not count them as quoting the body)."""
    from . import batch_serializers  # noqa: F401 - its shapes are ApiInput subclasses too

    words: set[str] = set()
    shapes, seen = [ApiInput], set()
    while shapes:
        shape = shapes.pop()
        shapes.extend(shape.__subclasses__())
        if shape in seen:
            continue
        seen.add(shape)
        fields = list(shape().fields.items())
        while fields:
            name, field = fields.pop()
            words.add(name)
            words.update(str(choice) for choice in getattr(field, "choices", {}))
            child = getattr(field, "child", None)
            if child is not None:
                fields.append((name, child))
    return frozenset(word.lower() for word in words)


_SHARED: dict = {}


def represent(serializer_class, obj) -> dict:
    """`serializer_class(obj).data` without building the serializer each time.

    A DRF serializer deep-copies all its declared fields whenever it is instantiated (for
    the claimed job, about a third of a claim request's Python time). Output shapes that
    need no context are rendered by one bound instance per class instead: to_representation
    keeps no per-call state in the serializer or its fields."""
    return _shared(_SHARED, serializer_class).to_representation(obj)


_SHARED_INPUT: dict = {}


def _shared(cache: dict, serializer_class):
    """The one instance of `serializer_class` in `cache`, its fields bound."""
    shared = cache.get(serializer_class)
    if shared is None:
        shared = serializer_class()
        shared.fields  # noqa: B018 - bind the fields once
        cache[serializer_class] = shared
    return shared


def validate_input(serializer_class, data) -> dict:
    """`serializer_class(data=data)`'s validated data, or its ValidationError, as is_valid()
    gives them, from one bound instance per class (the same saving as represent(), about
    0.3 ms of a report). Inputs validated here need no context and keep no state of their
    own: run_validation stores nothing on the serializer or its fields."""
    try:
        return _shared(_SHARED_INPUT, serializer_class).run_validation(data)
    except serializers.ValidationError as exc:
        raise serializers.ValidationError(serializers.as_serializer_error(exc)) from None


# --- jobs (output) -----------------------------------------------------------------------


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
    job_agent_id = serializers.UUIDField()
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

    class Meta:
        ref_name = "JobSummary"


class JobSerializer(JobSummarySerializer):
    """The job object. Never carries dispatch_context."""

    job_agent_config = JobAgentConfigField()
    result = serializers.JSONField(
        allow_null=True, help_text="At most JOBQUEUE_MAX_RESULT_BYTES (1 MiB) as JSON."
    )
    message = serializers.CharField(
        allow_blank=True, help_text="At most JOBQUEUE_MAX_MESSAGE_BYTES (64 KiB) as UTF-8."
    )

    class Meta:
        ref_name = "Job"


class JobCreatedSerializer(JobSerializer):
    """POST jobs' answer: the job, and whether a unique_key met a live job (200) instead of
    creating one (201)."""

    deduplicated = serializers.BooleanField(
        help_text="true: a live job with the unique_key was answered (unchanged, or replaced "
        "in place); false: the job was created (or this is an Idempotency-Key replay).")

    class Meta:
        ref_name = "JobCreated"


class ClaimedJobSerializer(JobSerializer):
    """The job as its claimer receives it: with the full dispatch_context."""

    dispatch_context = DispatchContextField()

    class Meta:
        ref_name = "ClaimedJob"


class JobListItemSerializer(serializers.Serializer):
    """Lightweight poll item."""

    id = serializers.UUIDField()
    status = serializers.ChoiceField(choices=states.CHOICES)
    attempt = serializers.IntegerField()
    max_attempts = serializers.IntegerField()
    priority = serializers.IntegerField()
    available_at = serializers.DateTimeField()
    created_at = serializers.DateTimeField()
    external_id = serializers.CharField(allow_blank=True)

    class Meta:
        ref_name = "JobListItem"


LIST_ITEM_FIELDS = ["id", "status", "attempt", "max_attempts", "priority", "available_at",
                    "created_at", "external_id"]


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


# --- claims ------------------------------------------------------------------------------


class ClaimInfoSerializer(serializers.Serializer):
    claim_id = serializers.UUIDField(
        help_text="Send it with every write about the job: it fences the service's record "
        "(fencing_token is for resources outside the service)."
    )
    lease_seconds = serializers.IntegerField()
    claim_expires_at = serializers.DateTimeField()
    attempt = serializers.IntegerField()
    heartbeat_interval_seconds = serializers.IntegerField(
        help_text="Suggested heartbeat interval (lease_seconds / 3 by default)."
    )
    server_time = serializers.DateTimeField(help_text="The database's clock at the claim.")
    checkpoint = serializers.JSONField(
        allow_null=True, help_text="The latest checkpoint an earlier attempt saved (null: none)."
    )
    fencing_token = serializers.SerializerMethodField(
        help_text="A compact JWS (EdDSA, Ed25519; `kid` in its header) of {iss, job_id, "
        "workspace_id, attempt, claim_id, iat, exp: the lease's end at claim time}, "
        "verifiable offline with GET /v1/.well-known/jwks.json. Hand it to outside resources: "
        "`attempt` orders a job's claims (docs/effects.md, fencing)."
    )

    class Meta:
        ref_name = "ClaimInfo"

    @extend_schema_field(serializers.CharField())
    def get_fencing_token(self, grant) -> str:
        return fencing.token_for(grant)


class ClaimResponseSerializer(serializers.Serializer):
    job = ClaimedJobSerializer()
    claim = ClaimInfoSerializer(source="*")

    class Meta:
        ref_name = "ClaimResponse"


class BatchClaimResponseSerializer(serializers.Serializer):
    claims = ClaimResponseSerializer(many=True)

    class Meta:
        ref_name = "BatchClaimResponse"


HOLDER_HELP = ("The agent process claiming (e.g. host and pid), up to 200 printable "
               "characters. Kept on the claim for operators (the admin); never in an answer.")


class ClaimInput(ApiInput):
    holder = StrictCharField(required=False, allow_blank=True, max_length=200,
                             trim_whitespace=False, help_text=HOLDER_HELP)
    expected_attempt = StrictIntegerField(
        required=False, min_value=0, max_value=INT32_MAX,
        help_text="Claim only while the job's `attempt` still equals this (else 409 "
        "job_not_claimable).",
    )

    class Meta:
        ref_name = "Claim"  # the request body: ClaimRequest


class ClaimNextInput(ApiInput):
    limit = StrictIntegerField(
        required=False,
        min_value=1,
        max_value=10_000,
        rule=inputs.claim_limit,
        help_text="Batch claim: up to this many jobs (bounded by JOBQUEUE_MAX_CLAIM_BATCH); "
        "the answer is then {\"claims\": [...]} and never 204.",
    )
    wait_seconds = StrictIntegerField(
        required=False,
        min_value=0,
        max_value=86_400,
        rule=inputs.wait_seconds,
        help_text="Long-poll: with nothing claimable, hold the request up to this many seconds "
        "(0 to JOBQUEUE_MAX_CLAIM_WAIT_SECONDS, default 50; beyond it is a 400) until a job "
        "becomes claimable for this agent, then claim it; after the wait, 204 (or "
        "{\"claims\": []}). A server holding its maximum of waits answers at once.",
    )
    holder = StrictCharField(required=False, allow_blank=True, max_length=200,
                             trim_whitespace=False, help_text=HOLDER_HELP)

    class Meta:
        ref_name = "ClaimNext"


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


# --- agent writes ------------------------------------------------------------------------


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


# --- producer and operator -----------------------------------------------------------------


class JobCreateInput(ApiInput):
    job_agent_id = StrictUUIDField()
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
        "in_progress one, create a new job.",
    )
    debounce_seconds = StrictIntegerField(
        required=False, allow_null=True, min_value=1, max_value=inputs.MAX_DEBOUNCE_SECONDS,
        help_text="With unique_key: the job waits this long after the last create that met it "
        "queued (which also gives it its dispatch_context).",
    )
    debounce_max_seconds = StrictIntegerField(
        required=False, allow_null=True, min_value=1,
        max_value=inputs.MAX_DEBOUNCE_MAX_SECONDS,
        help_text="With debounce_seconds (and at least it): no push past this long after the "
        "job's first create.",
    )

    class Meta:
        ref_name = "JobCreate"


class EmptyInput(ApiInput):
    """The body of an endpoint that takes none: absent or `{}` (any field is unknown)."""

    class Meta:
        ref_name = "Empty"


class ReasonInput(ApiInput):
    reason = StrictCharField(required=False, allow_blank=True, max_length=500)

    class Meta:
        ref_name = "Reason"


class GroupSerializer(serializers.Serializer):
    group = serializers.CharField()
    counts = serializers.DictField(
        child=serializers.IntegerField(), help_text="Jobs of the group by status (every status)."
    )
    finished = serializers.BooleanField(help_text="No job of the group is pending, queued or "
                                        "in progress.")
    cancelled_at = serializers.DateTimeField(allow_null=True)

    class Meta:
        ref_name = "Group"


class GroupCancelSerializer(serializers.Serializer):
    cancelled = serializers.IntegerField(help_text="Jobs this call cancelled.")

    class Meta:
        ref_name = "GroupCancelResponse"


class HealthSerializer(serializers.Serializer):
    last_seen_at = serializers.DateTimeField(allow_null=True)
    jobs_in_flight = serializers.IntegerField()
    leases_expired_24h = serializers.IntegerField()

    class Meta:
        ref_name = "JobAgentHealth"


class JobAgentSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    name = serializers.CharField()
    type = serializers.CharField()
    lease_seconds = serializers.IntegerField(source="effective_lease_seconds")
    max_attempts = serializers.IntegerField(source="effective_max_attempts")
    max_runtime_seconds = serializers.IntegerField(allow_null=True)
    created_at = serializers.DateTimeField()
    paused = serializers.SerializerMethodField(
        help_text="While paused, claims hand out nothing; jobs already claimed go on."
    )
    paused_at = serializers.DateTimeField(allow_null=True)
    paused_reason = serializers.CharField(help_text="The reason given with the pause, if any.")
    health = serializers.SerializerMethodField()

    class Meta:
        ref_name = "JobAgent"

    def get_paused(self, agent: JobAgent) -> bool:
        return agent.paused_at is not None

    @extend_schema_field(HealthSerializer)
    def get_health(self, agent: JobAgent):
        return HealthSerializer(
            {
                "last_seen_at": agent.last_seen_at,
                "jobs_in_flight": getattr(agent, "jobs_in_flight", 0),
                "leases_expired_24h": getattr(agent, "leases_expired_24h", 0),
            }
        ).data


class JobAgentCreateInput(ApiInput):
    name = StrictCharField(max_length=200)
    lease_seconds = StrictIntegerField(
        required=False, allow_null=True, min_value=1, max_value=INT32_MAX,
        rule=inputs.lease_seconds,
        help_text="Bounded by JOBQUEUE_MIN_LEASE_SECONDS..JOBQUEUE_MAX_LEASE_SECONDS.",
    )
    max_attempts = StrictIntegerField(
        required=False, allow_null=True, min_value=1, max_value=INT32_MAX,
        rule=inputs.max_attempts, help_text="Bounded by 1..JOBQUEUE_MAX_MAX_ATTEMPTS.",
    )
    max_runtime_seconds = StrictIntegerField(
        required=False, allow_null=True, min_value=1, max_value=INT32_MAX,
        rule=inputs.max_runtime_seconds,
        help_text="The max_runtime_seconds of its jobs that set none (default: no limit).",
    )

    class Meta:
        ref_name = "JobAgentCreate"


class TokenCreateInput(ApiInput):
    name = StrictCharField(required=False, default="default", max_length=200)

    class Meta:
        ref_name = "AgentTokenCreate"


class TokenSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    name = serializers.CharField()
    token = serializers.CharField(help_text="The secret: shown once, stored hashed.")
    created_at = serializers.DateTimeField()

    class Meta:
        ref_name = "AgentTokenIssued"


# --- pages -------------------------------------------------------------------------------


def page_of(item_serializer, name: str):
    """A {"results", "next", "previous"} page serializer for the schema. One page, not a
    list of pages: `many=False` tells drf-spectacular so in the viewsets' list actions."""
    return extend_schema_serializer(many=False)(type(
        name,
        (serializers.Serializer,),
        {
            "results": item_serializer(many=True),
            "next": serializers.URLField(allow_null=True),
            "previous": serializers.URLField(allow_null=True),
            "Meta": type("Meta", (), {"ref_name": name}),
        },
    ))


JobPage = page_of(JobSummarySerializer, "JobPage")
JobListItemPage = page_of(JobListItemSerializer, "JobListItemPage")
JobAgentPage = page_of(JobAgentSerializer, "JobAgentPage")

# The producer list loads only what it shows (never the bulky columns).
JOB_LIST_ONLY = ["id", "workspace_id", "job_agent_id", "status", "external_id", "group", "attempt",
                 "max_attempts", "priority", "available_at", "created_at", "started_at",
                 "completed_at", "updated_at", "idempotency_key", "unique_key"]


# --- webhooks ------------------------------------------------------------------------------


class WebhookUrlField(StrictCharField):
    """An http(s) URL with a host; the error never repeats it."""

    def __init__(self, **kwargs):
        super().__init__(max_length=2000, **kwargs)

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        try:
            parts = urlsplit(value)
            port_ok = parts.port is None or parts.port > 0
        except ValueError:
            port_ok = False
            parts = None
        if (parts is None or not port_ok or parts.scheme not in ("http", "https")
                or not parts.hostname or parts.username is not None or any(
                    c.isspace() or ord(c) < 32 for c in value)):
            raise serializers.ValidationError("Must be an http or https URL with a host.")
        return value


class WebhookCreateInput(ApiInput):
    url = WebhookUrlField()
    events = serializers.ListField(
        child=StrictChoiceField(choices=list(WebhookEndpoint.EVENTS)), required=False,
        max_length=len(WebhookEndpoint.EVENTS),
        help_text="The events to send; omitted or empty: all of them.")

    class Meta:
        ref_name = "WebhookCreate"


class WebhookSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    url = serializers.CharField()
    events = serializers.ListField(child=serializers.CharField())
    created_at = serializers.DateTimeField()

    class Meta:
        ref_name = "Webhook"


class WebhookCreatedSerializer(WebhookSerializer):
    secret = serializers.CharField(help_text="The signing secret: shown once, never again.")

    class Meta:
        ref_name = "WebhookCreated"


class WebhookDeliverySerializer(serializers.Serializer):
    id = serializers.UUIDField()
    event = serializers.CharField()
    job_id = serializers.UUIDField(allow_null=True, help_text="A job.finished delivery's job.")
    group = serializers.CharField(source="group.name", allow_null=True, default=None,
                                  help_text="A group.finished delivery's group.")
    status = serializers.ChoiceField(choices=WebhookDelivery.STATUSES)
    attempts = serializers.IntegerField()
    next_attempt_at = serializers.DateTimeField()
    created_at = serializers.DateTimeField()
    last_attempt_at = serializers.DateTimeField(allow_null=True)
    last_status_code = serializers.IntegerField(allow_null=True)
    last_error = serializers.CharField(allow_blank=True)

    class Meta:
        ref_name = "WebhookDelivery"


WebhookPage = page_of(WebhookSerializer, "WebhookPage")
WebhookDeliveryPage = page_of(WebhookDeliverySerializer, "WebhookDeliveryPage")
