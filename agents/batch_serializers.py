"""Request and response shapes of the batch endpoints (agents/views/job_agents.py).

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

from rest_framework import serializers

from jobqueue import lifecycle

from .serializers import ApiInput, StatusInput, StrictChoiceField, StrictUUIDField

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
