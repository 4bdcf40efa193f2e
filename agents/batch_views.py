"""Batch endpoints for agents that run many jobs at once.

POST job-agents/{agent_id}/heartbeat  {"claims": [{"job_id", "claim_id"}, ...]}
  -> 200 {"server_time", "results": [{"job_id", "renewed": true, "claim_expires_at"} |
                                     {"job_id", "renewed": false, "code"}]}

One statement renews every current, unexpired claim (lifecycle.heartbeat_many); each other
claim is answered with lease_expired, claim_superseded, job_cancelled, job_finished, or
not_found (not one of this agent's jobs). Bad input is a 400 and renews nothing. The batch
claim is the `{"limit": N}` form of POST job-agents/{agent_id}/jobs/claim (agents/views.py).

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

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from jobqueue import lifecycle

from .schema import COMMON, WITH_BODY, errors
from .serializers import StatusInput, StrictChoiceField, StrictUUIDField, represent
from .views import AGENT, ApiView

REFUSAL_CODES = ["lease_expired", "claim_superseded", "job_cancelled", "job_finished",
                 "not_found"]


class BatchHeartbeatItem(serializers.Serializer):
    job_id = serializers.UUIDField()
    claim_id = serializers.UUIDField()

    class Meta:
        ref_name = "BatchHeartbeatItem"


class BatchHeartbeatInput(serializers.Serializer):
    claims = serializers.ListField(
        child=BatchHeartbeatItem(),
        min_length=1,
        max_length=10_000,
        help_text="Up to JOBQUEUE_MAX_HEARTBEAT_BATCH claims (default 500), each job once.",
    )

    class Meta:
        ref_name = "BatchHeartbeatRequest"


class BatchHeartbeatOutcome(serializers.Serializer):
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

    def to_representation(self, outcome):
        if outcome.renewed:
            return {
                "job_id": str(outcome.job_id),
                "renewed": True,
                "claim_expires_at": serializers.DateTimeField().to_representation(
                    outcome.claim_expires_at
                ),
            }
        return {"job_id": str(outcome.job_id), "renewed": False, "code": outcome.code}


class BatchHeartbeatResponse(serializers.Serializer):
    server_time = serializers.DateTimeField()
    results = BatchHeartbeatOutcome(many=True)

    class Meta:
        ref_name = "BatchHeartbeatResponse"


class BatchHeartbeatView(ApiView):
    @extend_schema(
        tags=AGENT,
        operation_id="heartbeat_many",
        summary="Renew many claims of this agent at once; per claim: renewed, or why not",
        request=BatchHeartbeatInput,
        responses={200: BatchHeartbeatResponse, **errors(*WITH_BODY, *COMMON)},
    )
    def post(self, request, workspace_id, agent_id):
        data = self.validated(BatchHeartbeatInput)
        agent = self.agent_in_path()
        pairs = [(item["job_id"], item["claim_id"]) for item in data["claims"]]
        result = lifecycle.heartbeat_many(agent.id, pairs)
        return Response(represent(BatchHeartbeatResponse, result))


REPORT_REFUSAL_CODES = ["claim_superseded", "job_cancelled", "job_finished", "not_found"]


class BatchReportItem(StatusInput):
    """PUT jobs/{job_id}/status's body plus the job_id, final statuses only."""

    job_id = StrictUUIDField()
    status = StrictChoiceField(choices=sorted(lifecycle.BATCH_REPORT_STATUSES))

    class Meta:
        ref_name = "BatchReportItem"


class BatchReportInput(serializers.Serializer):
    reports = serializers.ListField(
        child=BatchReportItem(),
        min_length=1,
        max_length=10_000,
        help_text="Up to JOBQUEUE_MAX_REPORT_BATCH final reports (default 500), each job once.",
    )

    class Meta:
        ref_name = "BatchReportRequest"


class BatchReportOutcome(serializers.Serializer):
    job_id = serializers.UUIDField()
    accepted = serializers.BooleanField()
    status = serializers.ChoiceField(
        choices=sorted(lifecycle.BATCH_REPORT_STATUSES), required=False,
        help_text="The job's final status (accepted reports only).",
    )
    completed_at = serializers.DateTimeField(required=False, help_text="Accepted reports only.")
    code = serializers.ChoiceField(
        choices=REPORT_REFUSAL_CODES, required=False, help_text="Why not (refused reports only)."
    )

    class Meta:
        ref_name = "BatchReportOutcome"

    def to_representation(self, outcome):
        if outcome.accepted:
            return {
                "job_id": str(outcome.job_id),
                "accepted": True,
                "status": outcome.status,
                "completed_at": serializers.DateTimeField().to_representation(
                    outcome.completed_at
                ),
            }
        return {"job_id": str(outcome.job_id), "accepted": False, "code": outcome.code}


class BatchReportResponse(serializers.Serializer):
    results = BatchReportOutcome(many=True)

    class Meta:
        ref_name = "BatchReportResponse"


class BatchReportView(ApiView):
    @extend_schema(
        tags=AGENT,
        operation_id="report_many",
        summary="End many jobs of this agent at once; per report: accepted, or why not",
        request=BatchReportInput,
        responses={200: BatchReportResponse, **errors(*WITH_BODY, *COMMON)},
    )
    def post(self, request, workspace_id, agent_id):
        data = self.validated(BatchReportInput)
        agent = self.agent_in_path()
        result = lifecycle.report_many(agent.id, [dict(item) for item in data["reports"]])
        return Response(represent(BatchReportResponse, result))
