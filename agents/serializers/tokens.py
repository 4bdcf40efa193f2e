"""Shapes of the agent tokens endpoints (agents/views/tokens.py): the issue body and the
issued token (its secret shown once)."""

from __future__ import annotations

from rest_framework import serializers

from .fields import ApiInput, StrictCharField


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
