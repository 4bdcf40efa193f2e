"""Shapes of the agent tokens endpoints (agents/views/tokens.py): the issue body, the
issued token (its secret shown once) and the list (never a secret)."""

from __future__ import annotations

from rest_framework import serializers

from .fields import ApiInput, StrictCharField, page_of


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


class TokenListItemSerializer(serializers.Serializer):
    """An agent's token as a list shows it: never its secret."""

    id = serializers.UUIDField()
    name = serializers.CharField()
    prefix = serializers.CharField(
        help_text="The token's lookup prefix (the 12 characters after `jqa_`), to tell tokens "
                  "apart; not a secret.")
    created_at = serializers.DateTimeField()
    last_used_at = serializers.DateTimeField(
        allow_null=True,
        help_text="The latest request made with it (recorded at most once a minute).")
    revoked_at = serializers.DateTimeField(allow_null=True)

    class Meta:
        ref_name = "AgentToken"


TokenPage = page_of(TokenListItemSerializer, "AgentTokenPage")
