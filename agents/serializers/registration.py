"""Shapes of registration (agents/views/registration.py): registration tokens (workspace key)
and `POST /v1/register` (the token alone)."""

from __future__ import annotations

from rest_framework import serializers

from jobqueue.lifecycle import inputs

from .fields import ApiInput, StrictCharField, StrictIntegerField, labels_field, page_of
from .tokens import MAX_TOKEN_TTL_SECONDS

MAX_REGISTRATION_EXPIRES_IN_SECONDS = 30 * 24 * 3600
MAX_REGISTRATION_USES = 1_000_000


class RegistrationTokenCreateInput(ApiInput):
    description = StrictCharField(required=False, allow_blank=True, default="", max_length=500)
    labels = labels_field(
        inputs.MAX_AGENT_LABELS, required=False, default=list,
        help_text="The labels the agents it registers may have (empty: any).")
    max_uses = StrictIntegerField(
        required=False, default=1, min_value=1, max_value=MAX_REGISTRATION_USES,
        help_text="How many agents it may register (default 1).")
    expires_in_seconds = StrictIntegerField(
        required=False, default=3600, min_value=1,
        max_value=MAX_REGISTRATION_EXPIRES_IN_SECONDS,
        help_text="How long it may be used (1 s to 30 days, default 3600).")
    token_ttl_seconds = StrictIntegerField(
        required=False, allow_null=True, min_value=1, max_value=MAX_TOKEN_TTL_SECONDS,
        help_text="The lifetime of the agent tokens it issues (1 s to 365 days; none: they "
                  "never expire). Agents rotate them (tokens/rotate).")

    class Meta:
        ref_name = "RegistrationTokenCreate"


class RegistrationTokenSerializer(serializers.Serializer):
    """A registration token as listed: never its secret."""

    id = serializers.UUIDField()
    description = serializers.CharField()
    labels = serializers.ListField(child=serializers.CharField())
    max_uses = serializers.IntegerField()
    uses = serializers.IntegerField()
    expires_at = serializers.DateTimeField()
    token_ttl_seconds = serializers.IntegerField(allow_null=True)
    created_at = serializers.DateTimeField()
    revoked_at = serializers.DateTimeField(allow_null=True)

    class Meta:
        ref_name = "RegistrationToken"


class RegistrationTokenIssuedSerializer(RegistrationTokenSerializer):
    token = serializers.CharField(help_text="The secret: shown once, stored hashed.")

    class Meta:
        ref_name = "RegistrationTokenIssued"


RegistrationTokenPage = page_of(RegistrationTokenSerializer, "RegistrationTokenPage")


class RegisterInput(ApiInput):
    registration_token = StrictCharField(max_length=200)
    name = StrictCharField(max_length=200)
    labels = labels_field(
        inputs.MAX_AGENT_LABELS, required=False, allow_null=True,
        help_text="The agent's labels: a subset of the registration token's (default: the "
                  "token's).")

    class Meta:
        ref_name = "Register"


class RegisteredAgentSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    name = serializers.CharField()
    labels = serializers.ListField(child=serializers.CharField())

    class Meta:
        ref_name = "RegisteredAgent"


class AgentSettingsSerializer(serializers.Serializer):
    lease_seconds = serializers.IntegerField()
    heartbeat_interval_seconds = serializers.IntegerField()
    max_wait_seconds = serializers.IntegerField(
        help_text="The largest wait_seconds a claim-next may ask.")

    class Meta:
        ref_name = "AgentSettings"


class RegisteredSerializer(serializers.Serializer):
    workspace_id = serializers.UUIDField()
    job_agent = RegisteredAgentSerializer()
    token = serializers.CharField(help_text="The agent's token: shown once, stored hashed.")
    token_expires_at = serializers.DateTimeField(allow_null=True)
    settings = AgentSettingsSerializer()

    class Meta:
        ref_name = "Registered"
