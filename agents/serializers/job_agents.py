"""Shapes of the job agents endpoints (agents/views/job_agents.py): the agent with its health
and its create body, and what an agent does through it: poll, claim a named job or the next
one (or a batch), renew many leases and end many jobs at once.

`dispatch_context` appears in exactly one output shape, ClaimedJobSerializer (below), which
only the claim views render.

The batch heartbeat and report:

Request and response shapes of the batch endpoints (agents/views/job_agents.py).

POST job-agents/{agent_id}/heartbeat  {"claims": [{"job_id", "claim_id"}, ...]}
  -> 200 {"server_time", "results": [{"job_id", "renewed": true, "claim_expires_at"} |
                                     {"job_id", "renewed": false, "code"}]}

One statement renews every current, unexpired claim (lifecycle.heartbeat_many); each other
claim is answered with lease_expired, claim_superseded, job_cancelled, job_finished, or
not_found (not one of this agent's jobs). Bad input is a 400 and renews nothing. The batch
claim is the `{"limit": N}` form of POST job-agents/{agent_id}/jobs/claim.

POST job-agents/{agent_id}/reports  {"reports": [{"job_id", "claim_id", "status",
                                                  "message"?, "result"?, "external_id"?}, ...]}
  -> 200 {"results": [{"job_id", "accepted": true, "status", "completed_at"} |
                      {"job_id", "accepted": false, "code"}]}

Ends many jobs at once (lifecycle.report_many): every report whose claim is current, in one
transaction. Each other report gets the single report's answer: accepted when it repeats the
job's final report, else job_cancelled, job_finished, claim_superseded or not_found. Bad input
is a 400 and ends nothing.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from jobqueue import fencing, lifecycle, states
from jobqueue.lifecycle import inputs
from jobqueue.models import JobAgent

from .fields import (
    INT32_MAX,
    ApiInput,
    StrictCharField,
    StrictChoiceField,
    StrictIntegerField,
    StrictUUIDField,
    labels_field,
    page_of,
)
from .jobs import DispatchContextField, JobSerializer, StatusInput

# --- job agents ---------------------------------------------------------------------------


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
    labels = serializers.ListField(
        child=serializers.CharField(), help_text="Its labels (sorted, each once).")
    last_seen_at = serializers.DateTimeField(
        allow_null=True,
        help_text="The latest request made with one of the agent's tokens (recorded at most "
                  "once a minute per token).")
    online = serializers.SerializerMethodField(
        help_text="Seen within JOBQUEUE_AGENT_ONLINE_SECONDS (120), by the database's clock.")
    health = serializers.SerializerMethodField()

    class Meta:
        ref_name = "JobAgent"

    def get_paused(self, agent: JobAgent) -> bool:
        return agent.paused_at is not None

    def get_online(self, agent: JobAgent) -> bool:
        # Computed by the database with the row (agents.health.with_health); an agent just
        # created has not been seen.
        return bool(getattr(agent, "online", False))

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
    labels = labels_field(
        inputs.MAX_AGENT_LABELS, required=False, default=list,
        help_text="Up to 32 labels, each 1 to 63 characters of A-Z a-z 0-9 . _ : = / - "
                  "(a set: repeats count once).")
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


class JobAgentUpdateInput(JobAgentCreateInput):
    """PATCH job-agents/{id}: the fields given change, the others stay (a null default
    returns to the service's)."""

    name = None
    labels = labels_field(
        inputs.MAX_AGENT_LABELS, required=False,
        help_text="Its new labels (replacing them; [] for none): claims made from now on "
                  "match labelled jobs by them.")

    class Meta:
        ref_name = "JobAgentUpdate"


JobAgentPage = page_of(JobAgentSerializer, "JobAgentPage")


# --- the agent's poll ---------------------------------------------------------------------


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


JobListItemPage = page_of(JobListItemSerializer, "JobListItemPage")


# --- claims -------------------------------------------------------------------------------


class ClaimedJobSerializer(JobSerializer):
    """The job as its claimer receives it: with the full dispatch_context."""

    dispatch_context = DispatchContextField()

    class Meta:
        ref_name = "ClaimedJob"


class ParentSerializer(serializers.Serializer):
    job_id = serializers.UUIDField()
    status = serializers.ChoiceField(choices=states.CHOICES)
    result = serializers.JSONField(allow_null=True)

    class Meta:
        ref_name = "Parent"


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
    parents = ParentSerializer(
        many=True, help_text="The jobs this one depends on, each with its status and result "
        "(the hand-off of a flow: an extract's result for its load); [] for a job without "
        "dependencies (which costs its claim nothing).")
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


# --- batch heartbeat and report ------------------------------------------------------------


REFUSAL_CODES = ["lease_expired", "claim_superseded", "job_cancelled", "job_finished",
                 "deadline_exceeded", "not_found"]
REPORT_REFUSAL_CODES = ["claim_superseded", "job_cancelled", "job_finished",
                        "deadline_exceeded", "not_found"]
_TIMESTAMP = serializers.DateTimeField()


def batch_of(child, help_text):
    """A request's list of items: at least one, bounded again by the lifecycle's setting."""
    return serializers.ListField(child=child, min_length=1, max_length=10_000, help_text=help_text)


class Outcome(serializers.Serializer):
    # One item's answer: `<flag>: true` and what a success carries, or `false` and a code.
    # (A comment: drf-spectacular would publish a docstring in every subclass's component.)
    flag: str

    def success(self, outcome) -> dict:
        raise NotImplementedError

    def to_representation(self, outcome):
        if getattr(outcome, self.flag):
            return {"job_id": str(outcome.job_id), self.flag: True, **self.success(outcome)}
        return {"job_id": str(outcome.job_id), self.flag: False, "code": outcome.code}


class BatchHeartbeatItem(ApiInput):
    job_id = StrictUUIDField()
    claim_id = StrictUUIDField()

    class Meta:
        ref_name = "BatchHeartbeatItem"

    def to_internal_value(self, data):
        return lifecycle.ClaimRef(**super().to_internal_value(data))


class BatchHeartbeatInput(ApiInput):
    claims = batch_of(
        BatchHeartbeatItem(),
        "Up to JOBQUEUE_MAX_HEARTBEAT_BATCH claims (default 500), each job once.",
    )

    class Meta:
        ref_name = "BatchHeartbeat"


class BatchHeartbeatOutcome(Outcome):
    flag = "renewed"
    job_id = serializers.UUIDField()
    renewed = serializers.BooleanField()
    claim_expires_at = serializers.DateTimeField(
        required=False, help_text="The new expiry (renewed claims only)."
    )
    code = serializers.ChoiceField(
        choices=REFUSAL_CODES, required=False, help_text="Why not (claims not renewed only)."
    )

    class Meta:
        ref_name = "BatchHeartbeatOutcome"

    def success(self, outcome) -> dict:
        return {"claim_expires_at": _TIMESTAMP.to_representation(outcome.claim_expires_at)}


class BatchHeartbeatResponse(serializers.Serializer):
    server_time = serializers.DateTimeField()
    results = BatchHeartbeatOutcome(many=True)

    class Meta:
        ref_name = "BatchHeartbeatResponse"


class BatchReportItem(StatusInput):
    """PUT jobs/{job_id}/status's body plus the job_id, final statuses only."""

    job_id = StrictUUIDField()
    status = StrictChoiceField(choices=sorted(lifecycle.BATCH_REPORT_STATUSES))
    checkpoint = None  # final statuses only: a checkpoint rides on progress reports

    class Meta:
        ref_name = "BatchReportItem"

    def to_internal_value(self, data):
        return lifecycle.ReportItem(**super().to_internal_value(data))


class BatchReportInput(ApiInput):
    reports = batch_of(
        BatchReportItem(),
        "Up to JOBQUEUE_MAX_REPORT_BATCH final reports (default 500), each job once.",
    )

    class Meta:
        ref_name = "BatchReport"


class BatchReportOutcome(Outcome):
    flag = "accepted"
    job_id = serializers.UUIDField()
    accepted = serializers.BooleanField()
    status = serializers.ChoiceField(
        choices=sorted(lifecycle.BATCH_REPORT_STATUSES | {"queued"}), required=False,
        help_text="The job's status after the report (accepted reports only): its final "
        "status, or `queued` for a retryable failure with attempts left.",
    )
    completed_at = serializers.DateTimeField(
        required=False, help_text="Accepted reports that ended the job only."
    )
    code = serializers.ChoiceField(
        choices=REPORT_REFUSAL_CODES, required=False, help_text="Why not (refused reports only)."
    )

    class Meta:
        ref_name = "BatchReportOutcome"

    def success(self, outcome) -> dict:
        if outcome.completed_at is None:  # a retryable failure: queued again
            return {"status": outcome.status}
        return {
            "status": outcome.status,
            "completed_at": _TIMESTAMP.to_representation(outcome.completed_at),
        }


class BatchReportResponse(serializers.Serializer):
    results = BatchReportOutcome(many=True)

    class Meta:
        ref_name = "BatchReportResponse"
