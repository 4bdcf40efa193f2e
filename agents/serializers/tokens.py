"""Shapes of the agent tokens endpoints (agents/views/tokens.py): the issue body, the
issued token (its secret shown once), the list (never a secret) and the rotation."""

from __future__ import annotations

from rest_framework import serializers

from .fields import ApiInput, StrictCharField, StrictIntegerField, page_of

MAX_TOKEN_TTL_SECONDS = 365 * 24 * 3600
MAX_OVERLAP_SECONDS = 86400
DEFAULT_OVERLAP_SECONDS = 300


class TokenCreateInput(ApiInput):
    name = StrictCharField(required=False, default="default", max_length=200)
    ttl_seconds = StrictIntegerField(
        required=False, allow_null=True, min_value=1, max_value=MAX_TOKEN_TTL_SECONDS,
        help_text="The token's lifetime (1 s to 365 days; none: it never expires). Tokens "
                  "rotated from it get the same.")

    class Meta:
        ref_name = "AgentTokenCreate"


class TokenSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    name = serializers.CharField()
    token = serializers.CharField(help_text="The secret: shown once, stored hashed.")
    token_expires_at = serializers.DateTimeField(
        allow_null=True, help_text="When it stops working (null: never).")
    created_at = serializers.DateTimeField()

    class Meta:
        ref_name = "AgentTokenIssued"


class TokenRotateInput(ApiInput):
    overlap_seconds = StrictIntegerField(
        required=False, default=DEFAULT_OVERLAP_SECONDS, min_value=0,
        max_value=MAX_OVERLAP_SECONDS,
        help_text="How long the presenting token keeps working (0 to 86400, default 300).")

    class Meta:
        ref_name = "AgentTokenRotate"


class TokenRotatedSerializer(TokenSerializer):
    """The new token (its secret shown once), and when the presenting one stops working."""

    previous_token_expires_at = serializers.DateTimeField(
        help_text="When the presenting token stops working: the end of the overlap.")

    class Meta:
        ref_name = "AgentTokenRotated"


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
    expires_at = serializers.DateTimeField(
        allow_null=True, help_text="When it stops (or stopped) working; null: never.")
    revoked_at = serializers.DateTimeField(allow_null=True)

    class Meta:
        ref_name = "AgentToken"


TokenPage = page_of(TokenListItemSerializer, "AgentTokenPage")
