"""Request and response shapes of the effect ledger endpoints (agents/views/effects.py;
docs/effects.md)."""

from __future__ import annotations

from rest_framework import serializers

from jobqueue.lifecycle.effects import COMMITTED, STARTED, UNKNOWN

from .fields import ApiInput, StrictUUIDField

RESULT_HELP = ("Any JSON, at most JOBQUEUE_MAX_RESULT_BYTES (default 1 MiB) as compact JSON; "
               "beyond is a 400 validation_error that records nothing.")


class EffectBeginInput(ApiInput):
    claim_id = StrictUUIDField()

    class Meta:
        ref_name = "EffectBegin"


class EffectCommitInput(ApiInput):
    claim_id = StrictUUIDField()
    result = serializers.JSONField(allow_null=True, help_text=RESULT_HELP)

    class Meta:
        ref_name = "EffectCommit"


class EffectAnswerSerializer(serializers.Serializer):
    state = serializers.ChoiceField(
        choices=[STARTED, UNKNOWN, COMMITTED],
        help_text="started: this attempt began it, do it now; unknown: an earlier attempt "
        "began it and recorded no outcome, reconcile with the outside system using effect_id; "
        "committed: done, here is its result, do not do it again.")
    effect_id = serializers.UUIDField(
        help_text="Stable for the job and key: the outside system's idempotency key.")
    attempt = serializers.IntegerField(
        help_text="started: this attempt; unknown: the earlier attempt that began it; "
        "committed: the attempt that recorded the outcome.")
    result = serializers.JSONField(required=False, allow_null=True,
                                   help_text="committed only: the recorded outcome.")

    class Meta:
        ref_name = "EffectAnswer"

    def to_representation(self, instance):
        data = super().to_representation(instance)
        if instance.state != COMMITTED:
            data.pop("result", None)
        return data


class EffectSerializer(serializers.Serializer):
    effect_id = serializers.UUIDField(source="id")
    key = serializers.CharField()
    state = serializers.SerializerMethodField(
        help_text="committed (its outcome is recorded) or started (begun, no outcome yet).")
    attempt = serializers.IntegerField(help_text="The attempt that began it last.")
    earlier_attempt = serializers.IntegerField(
        allow_null=True, help_text="The attempt that had begun it before `attempt` took it "
        "over (its begin answered unknown); null: `attempt` was the first.")
    begun_at = serializers.DateTimeField()
    committed_attempt = serializers.IntegerField(allow_null=True)
    committed_at = serializers.DateTimeField(allow_null=True)
    result = serializers.JSONField(allow_null=True)

    class Meta:
        ref_name = "Effect"

    def get_state(self, obj) -> str:
        return COMMITTED if obj.committed else STARTED


class EffectListSerializer(serializers.Serializer):
    results = EffectSerializer(many=True)

    class Meta:
        ref_name = "EffectList"
