"""Rate limits in the admin (docs/api.md, "Rate limits"): the "Rate limits" page beside the job
list (the keys with the most jobs held back, each with its limit, its jobs claimed in the
window, its queued jobs given a permit and those held back: jobqueue.keystats, what /metrics
reads too), the job list's two filters (whether a job has a rate limit key, is held back by
it; one key, as the page links it), and the limits themselves (RateLimitAdmin): an operator
adds, changes and deletes a workspace's limit, which goes through
jobqueue.lifecycle.ratelimits (set_limit / delete_limit give the key's permits out, as PUT and
DELETE rate-limits/{key} do), checked by the API's rules (lifecycle.inputs)."""

from __future__ import annotations

from django import forms
from django.contrib import admin
from django.core.exceptions import PermissionDenied, ValidationError
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.http import urlencode

from jobqueue import states
from jobqueue.exceptions import InvalidInput
from jobqueue.keystats import busiest_rate_keys, with_rate_stats
from jobqueue.lifecycle import inputs, ratelimits
from jobqueue.models import RateLimit, Workspace

from .common import OfferedFiltersOnly

# The keys the page lists, at most (the most held back first).
RATE_LIMIT_ROWS = 100


class RateLimitFilter(admin.SimpleListFilter):
    title = "rate limit key"
    parameter_name = "rate_limit"

    def lookups(self, request, model_admin):
        return [
            ("keyed", "with a key"),
            ("held", "held back by its rate limit"),
            ("none", "without a key"),
        ]

    def queryset(self, request, queryset):
        value = self.value()
        if value == "keyed":
            return queryset.filter(rate_limit_key__isnull=False)
        if value == "held":
            return queryset.filter(status=states.QUEUED, rate_held=True)
        if value == "none":
            return queryset.filter(rate_limit_key__isnull=True)
        return queryset


class RateLimitKeyFilter(admin.SimpleListFilter):
    """One key's jobs, `?rate_limit_key=<key>` (with the workspace filter: one workspace's
    key), as the Rate limits page links them. Offered only while in use (as the concurrency
    key's: listing the keys would read every job's key on each page of the list)."""

    title = "this rate limit key"
    parameter_name = "rate_limit_key"

    def lookups(self, request, model_admin):
        value = self.value()
        return [(value, value)] if value else []

    def queryset(self, request, queryset):
        value = self.value()
        return queryset.filter(rate_limit_key=value) if value else queryset


def rate_key_jobs_url(workspace_id, key: str, **more) -> str:
    """The job list of one workspace's rate limit key."""
    return reverse("admin:jobqueue_job_changelist") + "?" + urlencode(
        {"workspace__id__exact": str(workspace_id), "rate_limit_key": key, **more})


class RateLimitViews:
    """Mixed into JobAdmin (jobs.py): the Rate limits page, with the view permission on
    jobs."""

    def get_urls(self):
        wrap = self.admin_site.admin_view
        return [
            path("rate-limits/", wrap(self.rate_limits_view), name="jobqueue_job_ratelimits"),
        ] + super().get_urls()

    def rate_limits_view(self, request):
        if not self.has_view_permission(request):
            raise PermissionDenied
        limits = self.admin_site.get_model_admin(RateLimit)
        context = {
            **self.admin_site.each_context(request),
            **rate_limits_context(),
            "title": "Rate limits",
            "opts": self.opts,
            "changelist_url": reverse("admin:jobqueue_job_changelist"),
            "limits_url": (reverse("admin:jobqueue_ratelimit_changelist")
                           if limits.has_view_permission(request) else None),
        }
        return TemplateResponse(request, "admin/jobqueue/ratelimits.html", context)


def rate_limits_context() -> dict:
    keys = busiest_rate_keys(RATE_LIMIT_ROWS)
    names = dict(Workspace.objects.filter(id__in={k.workspace_id for k in keys})
                 .values_list("id", "name"))
    return {
        "rows": [
            {
                "workspace": names.get(k.workspace_id, k.workspace_id),
                "key": k.key,
                "count": k.count,
                "period_seconds": k.period_seconds,
                "claimed": k.claimed,
                "permitted": k.permitted,
                "held": k.held,
                "jobs_url": rate_key_jobs_url(k.workspace_id, k.key),
                "held_url": rate_key_jobs_url(k.workspace_id, k.key, rate_limit="held"),
            }
            for k in keys
        ],
        "most": RATE_LIMIT_ROWS,
        "held_url": reverse("admin:jobqueue_job_changelist") + "?rate_limit=held",
    }


# --- the limits ---------------------------------------------------------------------------


class RateLimitForm(forms.ModelForm):
    """A limit as PUT rate-limits/{key} takes it: the key 1 to 255 printable characters, count
    1 to 100,000 claims in period_seconds 1 to 86,400 (lifecycle.inputs, one rule)."""

    class Meta:
        model = RateLimit
        fields = ["workspace", "key", "count", "period_seconds"]
        help_texts = {
            "key": "The jobs' rate_limit_key (1 to 255 printable characters).",
            "count": "At most this many of the key's jobs are claimed in any window (1 to "
                     "100,000).",
            "period_seconds": "The window, in seconds (1 to 86,400).",
        }

    def clean_key(self):
        key = self.cleaned_data.get("key")
        try:
            return inputs.key_text(key, "key")
        except InvalidInput as exc:
            raise ValidationError(exc.detail) from exc

    def clean(self):
        cleaned = super().clean()
        count, period = cleaned.get("count"), cleaned.get("period_seconds")
        if count is not None and period is not None:
            try:
                inputs.rate_limit(count, period)
            except InvalidInput as exc:
                self.add_error(exc.context.get("field"), exc.detail)
        return cleaned


@admin.register(RateLimit)
class RateLimitAdmin(OfferedFiltersOnly):
    """A workspace's limits: each saved or deleted through jobqueue.lifecycle.ratelimits (a
    limit set, raised or removed gives the key's permits out at once), never by a plain save
    or delete of the row."""

    form = RateLimitForm
    list_display = ["key", "workspace", "limit", "claimed_display", "permitted_display",
                    "held_display", "updated_at"]
    list_filter = ["workspace"]
    list_select_related = ["workspace"]
    search_fields = ["=key"]
    search_help_text = "Search by key (exact)."
    readonly_fields = ["created_at", "updated_at", "claimed_display", "permitted_display",
                       "held_display"]

    def get_fields(self, request, obj=None):
        head = ["workspace", "key"]
        if obj is None:
            return head + ["count", "period_seconds"]
        return head + ["count", "period_seconds", "claimed_display", "permitted_display",
                       "held_display", "created_at", "updated_at"]

    def get_readonly_fields(self, request, obj=None):
        # A limit is the workspace's and the key's: another key is another limit.
        return self.readonly_fields + (["workspace", "key"] if obj is not None else [])

    def get_queryset(self, request):
        return with_rate_stats(super().get_queryset(request))

    @admin.display(description="limit")
    def limit(self, obj):
        return f"{obj.count} / {obj.period_seconds} s"

    @admin.display(description="claimed in the window", ordering="claimed")
    def claimed_display(self, obj):
        return obj.claimed

    @admin.display(description="queued with a permit", ordering="permitted")
    def permitted_display(self, obj):
        return obj.permitted

    @admin.display(description="held back", ordering="held")
    def held_display(self, obj):
        if not obj.held:
            return 0
        return format_html('<a href="{}">{}</a>', rate_key_jobs_url(
            obj.workspace_id, obj.key, rate_limit="held"), obj.held)

    def save_model(self, request, obj, form, change):
        saved = ratelimits.set_limit(obj.workspace_id, obj.key, obj.count, obj.period_seconds)
        obj.pk, obj.created_at, obj.updated_at = saved.pk, saved.created_at, saved.updated_at

    def delete_model(self, request, obj):
        ratelimits.delete_limit(obj.workspace_id, obj.key)

    def delete_queryset(self, request, queryset):
        for workspace_id, key in queryset.values_list("workspace_id", "key"):
            ratelimits.delete_limit(workspace_id, key)
