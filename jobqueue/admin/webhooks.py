"""Webhooks in the admin: endpoints (never their secret) and the delivery log, every try with
its status code, duration and error, and a "redeliver" action (the change permission). A
delivery's body is shown as it is sent: its agent text redacted (jobqueue.redaction)."""

from __future__ import annotations

import json

from django.contrib import admin, messages
from django.utils.html import format_html

from jobqueue.maintenance import webhooks
from jobqueue.models import Job, WebhookAttempt, WebhookDelivery, WebhookEndpoint
from jobqueue.redaction import secret_strings

from .common import OfferedFiltersOnly


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(OfferedFiltersOnly):
    list_display = ["id", "workspace", "url", "events", "created_at"]
    list_filter = ["workspace"]
    search_fields = ["url"]
    fields = readonly_fields = ["id", "workspace", "url", "events", "created_at"]  # no secret

    def has_add_permission(self, request):
        return False  # the API creates endpoints: it shows the secret once

    def has_change_permission(self, request, obj=None):
        return False


class AttemptInline(admin.TabularInline):
    model = WebhookAttempt
    fields = readonly_fields = ["number", "started_at", "duration_seconds", "status_code",
                                "error"]
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(OfferedFiltersOnly):
    list_display = ["id", "event", "status", "attempts", "last_status_code", "job_id",
                    "group", "endpoint", "created_at", "next_attempt_at"]
    list_select_related = ["group", "endpoint"]
    list_filter = ["status", "event"]
    search_fields = ["=id", "=job__id", "=group__name"]
    fields = readonly_fields = ["id", "endpoint", "job", "group", "event", "status", "attempts",
                                "created_at", "last_attempt_at", "next_attempt_at",
                                "last_status_code", "last_error", "payload_display"]
    inlines = [AttemptInline]
    actions = ["redeliver"]

    @admin.display(description="payload (as sent)")
    def payload_display(self, obj):
        if obj.payload is None:
            return "— (fixed at its first try)"
        context = Job.objects.filter(id=obj.job_id).values_list("dispatch_context",
                                                                 flat=True).first()
        body = webhooks.body_of(obj, secret_strings(context))
        return format_html("<pre>{}</pre>", json.dumps(json.loads(body), indent=2))

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.action(description="Redeliver selected deliveries (now, with every try again)",
                  permissions=["change"])
    def redeliver(self, request, queryset):
        n = webhooks.redeliver(queryset.values_list("id", flat=True))
        self.message_user(request, f"{n} delivery(ies) will be sent again.", messages.SUCCESS)
