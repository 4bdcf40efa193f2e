"""Shapes of the webhooks endpoints (agents/views/webhooks.py): an endpoint's create body, the
endpoint (with its signing secret once, at its creation), its deliveries, their pages."""

from __future__ import annotations

from urllib.parse import urlsplit

from rest_framework import serializers

from jobqueue.models import WebhookDelivery, WebhookEndpoint

from .fields import ApiInput, StrictCharField, StrictChoiceField, page_of


class WebhookUrlField(StrictCharField):
    """An http(s) URL with a host; the error never repeats it."""

    def __init__(self, **kwargs):
        super().__init__(max_length=2000, **kwargs)

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        try:
            parts = urlsplit(value)
            port_ok = parts.port is None or parts.port > 0
        except ValueError:
            port_ok = False
            parts = None
        if (parts is None or not port_ok or parts.scheme not in ("http", "https")
                or not parts.hostname or parts.username is not None or any(
                    c.isspace() or ord(c) < 32 for c in value)):
            raise serializers.ValidationError("Must be an http or https URL with a host.")
        return value


class WebhookCreateInput(ApiInput):
    url = WebhookUrlField()
    events = serializers.ListField(
        child=StrictChoiceField(choices=list(WebhookEndpoint.EVENTS)), required=False,
        max_length=len(WebhookEndpoint.EVENTS),
        help_text="The events to send; omitted or empty: all of them.")

    class Meta:
        ref_name = "WebhookCreate"


class WebhookSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    url = serializers.CharField()
    events = serializers.ListField(child=serializers.CharField())
    created_at = serializers.DateTimeField()

    class Meta:
        ref_name = "Webhook"


class WebhookCreatedSerializer(WebhookSerializer):
    secret = serializers.CharField(help_text="The signing secret: shown once, never again.")

    class Meta:
        ref_name = "WebhookCreated"


class WebhookDeliverySerializer(serializers.Serializer):
    id = serializers.UUIDField()
    event = serializers.CharField()
    job_id = serializers.UUIDField(allow_null=True, help_text="A job.finished delivery's job.")
    group = serializers.CharField(source="group.name", allow_null=True, default=None,
                                  help_text="A group.finished delivery's group.")
    status = serializers.ChoiceField(choices=WebhookDelivery.STATUSES)
    attempts = serializers.IntegerField()
    next_attempt_at = serializers.DateTimeField()
    created_at = serializers.DateTimeField()
    last_attempt_at = serializers.DateTimeField(allow_null=True)
    last_status_code = serializers.IntegerField(allow_null=True)
    last_error = serializers.CharField(allow_blank=True)

    class Meta:
        ref_name = "WebhookDelivery"


WebhookPage = page_of(WebhookSerializer, "WebhookPage")
WebhookDeliveryPage = page_of(WebhookDeliverySerializer, "WebhookDeliveryPage")
