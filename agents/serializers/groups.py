"""Shapes of the groups endpoints (agents/views/groups.py): a group's state and its cancel's
answer (the cancel's body is fields.ReasonInput)."""

from __future__ import annotations

from rest_framework import serializers


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
