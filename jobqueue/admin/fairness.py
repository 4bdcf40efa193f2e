"""Fair shares in the admin (docs/api.md, "Fair shares"): the "Fair shares" page beside the job
list (the keys with the most jobs queued, each with its weight, its jobs queued and in progress,
and the share of the next claims of fair jobs it would get: jobqueue.keystats, what /metrics
reads too), the job list's two filters (whether a job has a fairness key; one key, as the page
links it), and the weights themselves (FairnessKeyAdmin): an operator adds, changes and deletes
a workspace's weight of a key, which goes through jobqueue.lifecycle.fairness (set_weight /
delete_weight respace the key's queued jobs, as PUT and DELETE fairness-keys/{key} do),
checked by the API's rules (lifecycle.inputs). A fairness key holds no job back: it only
orders them, so nothing here is "held back"."""

from __future__ import annotations

from django import forms
from django.contrib import admin
from django.core.exceptions import PermissionDenied, ValidationError
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.http import urlencode

from jobqueue.exceptions import InvalidInput
from jobqueue.keystats import busiest_fairness_keys, queued_weights, with_fairness_stats
from jobqueue.lifecycle import fairness, inputs
from jobqueue.models import FairnessKey, Workspace

from .common import OfferedFiltersOnly

# The keys the page lists, at most (the most queued first).
FAIRNESS_ROWS = 100


class FairnessFilter(admin.SimpleListFilter):
    title = "fairness key"
    parameter_name = "fairness"

    def lookups(self, request, model_admin):
        return [("keyed", "with a key"), ("none", "without a key")]

    def queryset(self, request, queryset):
        value = self.value()
        if value == "keyed":
            return queryset.filter(fairness_key__isnull=False)
        if value == "none":
            return queryset.filter(fairness_key__isnull=True)
        return queryset


class FairnessKeyFilter(admin.SimpleListFilter):
    """One key's jobs, `?fairness_key=<key>` (with the workspace filter: one workspace's key),
    as the Fair shares page links them. Offered only while in use (as the concurrency key's:
    listing the keys would read every job's key on each page of the list)."""

    title = "this fairness key"
    parameter_name = "fairness_key"

    def lookups(self, request, model_admin):
        value = self.value()
        return [(value, value)] if value else []

    def queryset(self, request, queryset):
        value = self.value()
        return queryset.filter(fairness_key=value) if value else queryset


def fair_key_jobs_url(workspace_id, key: str, **more) -> str:
    """The job list of one workspace's fairness key."""
    return reverse("admin:jobqueue_job_changelist") + "?" + urlencode(
        {"workspace__id__exact": str(workspace_id), "fairness_key": key, **more})


def share_percent(weight: int, queued: int, total: int | None) -> float:
    """A key's share of the next claims of its workspace's fair jobs, in percent: its weight
    over the sum of the weights of the keys with jobs queued (0 with nothing queued: a key
    with nothing to claim takes nothing)."""
    if not queued or not total:
        return 0.0
    return 100.0 * weight / total


class FairnessViews:
    """Mixed into JobAdmin (jobs.py): the Fair shares page, with the view permission on
    jobs."""

    def get_urls(self):
        wrap = self.admin_site.admin_view
        return [
            path("fair-shares/", wrap(self.fair_shares_view), name="jobqueue_job_fairness"),
        ] + super().get_urls()

    def fair_shares_view(self, request):
        if not self.has_view_permission(request):
            raise PermissionDenied
        weights = self.admin_site.get_model_admin(FairnessKey)
        context = {
            **self.admin_site.each_context(request),
            **fair_shares_context(),
            "title": "Fair shares",
            "opts": self.opts,
            "changelist_url": reverse("admin:jobqueue_job_changelist"),
            "weights_url": (reverse("admin:jobqueue_fairnesskey_changelist")
                            if weights.has_view_permission(request) else None),
        }
        return TemplateResponse(request, "admin/jobqueue/fairness.html", context)


def fair_shares_context() -> dict:
    keys = busiest_fairness_keys(FAIRNESS_ROWS)
    workspaces = {k.workspace_id for k in keys}
    names = dict(Workspace.objects.filter(id__in=workspaces).values_list("id", "name"))
    totals = queued_weights(workspaces)
    return {
        "rows": [
            {
                "workspace": names.get(k.workspace_id, k.workspace_id),
                "key": k.key,
                "weight": k.weight,
                "queued": k.queued,
                "running": k.running,
                "share": share_percent(k.weight, k.queued, totals.get(k.workspace_id)),
                "jobs_url": fair_key_jobs_url(k.workspace_id, k.key),
            }
            for k in keys
        ],
        "most": FAIRNESS_ROWS,
        "keyed_url": reverse("admin:jobqueue_job_changelist") + "?fairness=keyed",
    }


# --- the weights --------------------------------------------------------------------------


class FairnessKeyForm(forms.ModelForm):
    """A weight as PUT fairness-keys/{key} takes it: the key 1 to 255 printable characters,
    the weight 1 to 100 (lifecycle.inputs, one rule)."""

    class Meta:
        model = FairnessKey
        fields = ["workspace", "key", "weight"]
        help_texts = {
            "key": "The jobs' fairness_key (1 to 255 printable characters).",
            "weight": "The key's claims against the others', in proportion (1 to 100; a key "
                      "without a weight weighs 1).",
        }

    def clean_key(self):
        key = self.cleaned_data.get("key")
        try:
            return inputs.key_text(key, "key")
        except InvalidInput as exc:
            raise ValidationError(exc.detail) from exc

    def clean_weight(self):
        weight = self.cleaned_data.get("weight")
        try:
            return inputs.fairness_weight(weight)
        except InvalidInput as exc:
            raise ValidationError(exc.detail) from exc


@admin.register(FairnessKey)
class FairnessKeyAdmin(OfferedFiltersOnly):
    """A workspace's weights: each saved or deleted through jobqueue.lifecycle.fairness (a
    weight set, changed or removed respaces the key's queued jobs at once), never by a plain
    save or delete of the row."""

    form = FairnessKeyForm
    list_display = ["key", "workspace", "weight", "queued_display", "running_display",
                    "updated_at"]
    list_filter = ["workspace"]
    list_select_related = ["workspace"]
    search_fields = ["=key"]
    search_help_text = "Search by key (exact)."
    readonly_fields = ["created_at", "updated_at", "queued_display", "running_display"]

    def get_fields(self, request, obj=None):
        head = ["workspace", "key", "weight"]
        if obj is None:
            return head
        return head + ["queued_display", "running_display", "created_at", "updated_at"]

    def get_readonly_fields(self, request, obj=None):
        # A weight is the workspace's and the key's: another key is another weight.
        return self.readonly_fields + (["workspace", "key"] if obj is not None else [])

    def get_queryset(self, request):
        return with_fairness_stats(super().get_queryset(request))

    @admin.display(description="queued", ordering="queued")
    def queued_display(self, obj):
        if not obj.queued:
            return 0
        return format_html('<a href="{}">{}</a>', fair_key_jobs_url(
            obj.workspace_id, obj.key, status__exact="queued"), obj.queued)

    @admin.display(description="in progress", ordering="running")
    def running_display(self, obj):
        return obj.running

    def save_model(self, request, obj, form, change):
        saved = fairness.set_weight(obj.workspace_id, obj.key, obj.weight)
        obj.pk, obj.created_at, obj.updated_at = saved.pk, saved.created_at, saved.updated_at

    def delete_model(self, request, obj):
        fairness.delete_weight(obj.workspace_id, obj.key)

    def delete_queryset(self, request, queryset):
        for workspace_id, key in queryset.values_list("workspace_id", "key"):
            fairness.delete_weight(workspace_id, key)
