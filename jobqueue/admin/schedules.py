"""Schedules in the admin: listed with their cron, time zone, last and next fires and their
fires by outcome; a schedule's page shows its job (without the dispatch_context: its keys
only) and its latest fires. Pause and resume are actions (the change permission), through
the lifecycle (lifecycle.schedules.update_schedule) with a log entry; the API creates and
changes schedules otherwise."""

from __future__ import annotations

from django.contrib import admin, messages
from django.utils.html import format_html, format_html_join

from jobqueue.db import db_now
from jobqueue.lifecycle import schedules
from jobqueue.models import Schedule

from .common import OfferedFiltersOnly, operator_actor

RECENT_FIRES = 20


@admin.register(Schedule)
class ScheduleAdmin(OfferedFiltersOnly):
    list_display = ["name", "workspace", "cron", "timezone", "overlap", "paused",
                    "last_fire_at", "next_fire_at", "fired", "skipped", "missed"]
    list_select_related = ["workspace"]
    list_filter = ["workspace", "overlap", ("paused_at", admin.EmptyFieldListFilter)]
    search_fields = ["name", "=id"]
    fields = readonly_fields = [
        "id", "workspace", "name", "cron", "timezone", "overlap", "catchup_window_seconds",
        "job_agent", "job_display", "paused_at", "next_fires", "last_fire_at", "last_job_id",
        "fired", "skipped", "missed", "recent_fires", "created_at", "updated_at"]
    actions = ["pause", "resume"]

    def get_queryset(self, request):
        return super().get_queryset(request).defer("job")  # its dispatch_context: page only

    @admin.display(boolean=True, description="paused", ordering="paused_at")
    def paused(self, obj):
        return obj.paused_at is not None

    @admin.display(description="job (dispatch_context: keys only)")
    def job_display(self, obj):
        shown = {k: v for k, v in obj.job.items() if k != "dispatch_context"}
        keys = sorted(str(k) for k in (obj.job.get("dispatch_context") or {}))
        return format_html("<pre>{}</pre><p>dispatch_context keys: {}</p>", shown,
                           ", ".join(keys) or "—")

    @admin.display(description="next fires (UTC)")
    def next_fires(self, obj):
        return ", ".join(t.isoformat() for t in schedules.next_fire_times(obj, db_now()))

    @admin.display(description=f"latest fires (up to {RECENT_FIRES})")
    def recent_fires(self, obj):
        fires = obj.fires.order_by("-fire_time", "-id")[:RECENT_FIRES]
        return format_html("<ul>{}</ul>", format_html_join(
            "", "<li>{} {}{} {}</li>",
            ((f.fire_time.isoformat(), f.outcome, " (trigger)" if f.trigger else "",
              f.detail or (f.job_id or "")) for f in fires))) if fires else "—"

    def has_add_permission(self, request):
        return False  # the API creates schedules (their job is POST jobs' body, validated)

    def has_change_permission(self, request, obj=None):
        # The page is read-only; the change permission is what the pause and resume actions
        # need (ModelAdmin checks has_<name>_permission).
        return obj is None and super().has_change_permission(request, obj)

    def has_pause_permission(self, request):
        return super().has_change_permission(request)

    @admin.action(description="Pause the selected schedules", permissions=["pause"])
    def pause(self, request, queryset):
        self._set_paused(request, queryset, True)

    @admin.action(description="Resume the selected schedules (from their next fire time after "
                  "now)", permissions=["pause"])
    def resume(self, request, queryset):
        self._set_paused(request, queryset, False)

    def _set_paused(self, request, queryset, paused: bool):
        verb = "paused" if paused else "resumed"
        for schedule in queryset:
            schedules.update_schedule(schedule.id, workspace_id=schedule.workspace_id,
                                      paused=paused)
            self.log_change(request, schedule, f"{verb} by {operator_actor(request)}")
        self.message_user(request, f"{queryset.count()} schedule(s) {verb}.", messages.SUCCESS)
