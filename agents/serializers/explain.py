"""The shape of `GET jobs/{job_id}/explain` (agents/views/explain.py): why a job is not
running, from the claim rule (jobqueue/explain.py)."""

from __future__ import annotations

from rest_framework import serializers
from rest_framework.fields import SkipField

from jobqueue import states
from jobqueue.explain import CODES


class _OnlyWhenGiven:
    """A field a reason may give as null (allow_null, so the schema says so): absent when the
    reason does not give it (DRF would answer null for it in every other reason)."""

    def get_attribute(self, instance):
        if self.field_name not in instance:
            raise SkipField()
        return super().get_attribute(instance)


class _NullableInteger(_OnlyWhenGiven, serializers.IntegerField):
    pass


class _NullableDateTime(_OnlyWhenGiven, serializers.DateTimeField):
    pass


class ExplainReasonSerializer(serializers.Serializer):
    code = serializers.ChoiceField(
        choices=CODES, help_text="Stable machine-readable code (docs/api.md, \"Why isn't my "
        "job running? (explain)\").")
    detail = serializers.CharField(help_text="Human-readable explanation.")
    waiting_on = serializers.ListField(
        child=serializers.UUIDField(), required=False,
        help_text="waiting_on_dependencies: the ids of its parents not yet successful.")
    available_at = serializers.DateTimeField(
        required=False, help_text="not_before: when it becomes claimable.")
    expires_at = serializers.DateTimeField(
        required=False, help_text="deadline_passed: the deadline that passed.")
    key = serializers.CharField(
        required=False, help_text="concurrency_limit: the job's concurrency_key; "
        "rate_limited: its rate_limit_key.")
    running = serializers.IntegerField(
        required=False, help_text="concurrency_limit: the workspace's jobs with the key in "
        "progress now.")
    limit = serializers.IntegerField(
        required=False, help_text="concurrency_limit: the job's concurrency_limit (jobs of the "
        "key that may run at once).")
    count = _NullableInteger(
        required=False, allow_null=True, help_text="rate_limited: the key's limit, claims in "
        "any period_seconds (null: the key has no limit).")
    period_seconds = _NullableInteger(
        required=False, allow_null=True, help_text="rate_limited: the key's window, in "
        "seconds (null: no limit).")
    claimed = _NullableInteger(
        required=False, allow_null=True, help_text="rate_limited: the workspace's jobs with "
        "the key claimed in the window (by their latest claim; null: no limit).")
    until = _NullableDateTime(
        required=False, allow_null=True, help_text="rate_limited: when the window next lets "
        "a claim through (the database's clock: the oldest claim in it leaves, or a period "
        "from now when none is in it); null: the key has no limit.")
    group = serializers.CharField(required=False, help_text="group_cancelled: its group.")
    labels = serializers.ListField(
        child=serializers.CharField(), required=False,
        help_text="no_matching_agent: the labels no job agent of the workspace has all of.")
    job_agent_id = serializers.UUIDField(
        required=False, help_text="in_progress: the agent that holds it.")
    attempt = serializers.IntegerField(required=False, help_text="in_progress: its attempt.")

    class Meta:
        ref_name = "ExplainReason"


class ExplainAgentsSerializer(serializers.Serializer):
    matching = serializers.IntegerField(
        help_text="The job agents it is routed to: its agent, or for a labelled job every "
        "agent of the workspace whose labels include all of its own.")
    online = serializers.IntegerField(
        help_text="Of those, the ones seen within JOBQUEUE_AGENT_ONLINE_SECONDS (120).")

    class Meta:
        ref_name = "ExplainAgents"


class ExplanationSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=states.CHOICES, help_text="The job's status.")
    claimable = serializers.BooleanField(
        help_text="Whether a claim by an agent it is routed to would take it now "
        "(no_matching_agent and no_matching_agent_online may stand beside true).")
    reasons = ExplainReasonSerializer(
        many=True, help_text="Why it is not running; empty with claimable true: the next "
        "claim of an agent it is routed to takes it.")
    agents = ExplainAgentsSerializer()

    class Meta:
        ref_name = "Explanation"
