"""Concurrency keys in the admin, beside the job list: the "Concurrency keys" page (the keys
with the most jobs held back, each with its jobs in progress, its limit, its queued jobs given a
slot and those held back: jobqueue.keystats, what /metrics reads too) and the job list's two
filters (whether a job has a key, is held back by it; one key, as the page links it). Read-only:
a key has no row of its own, its jobs say it (job.concurrency_key, concurrency_limit; the
triggers of migration 0027 keep concurrency_held)."""

from __future__ import annotations

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.http import urlencode

from jobqueue import states
from jobqueue.keystats import busiest_keys
from jobqueue.models import Workspace

# The keys the page lists, at most (the most held back first).
CONCURRENCY_ROWS = 100


class ConcurrencyFilter(admin.SimpleListFilter):
    title = "concurrency key"
    parameter_name = "concurrency"

    def lookups(self, request, model_admin):
        return [
            ("keyed", "with a key"),
            ("held", "held back by its key"),
            ("none", "without a key"),
        ]

    def queryset(self, request, queryset):
        value = self.value()
        if value == "keyed":
            return queryset.filter(concurrency_key__isnull=False)
        if value == "held":
            return queryset.filter(status=states.QUEUED, concurrency_held=True)
        if value == "none":
            return queryset.filter(concurrency_key__isnull=True)
        return queryset


class ConcurrencyKeyFilter(admin.SimpleListFilter):
    """One key's jobs, `?concurrency_key=<key>` (with the workspace filter: one workspace's
    key), as the Concurrency keys page links them. Offered only while in use: listing the keys
    here would read every job's key on each page of the list."""

    title = "this concurrency key"
    parameter_name = "concurrency_key"

    def lookups(self, request, model_admin):
        value = self.value()
        return [(value, value)] if value else []

    def queryset(self, request, queryset):
        value = self.value()
        return queryset.filter(concurrency_key=value) if value else queryset


def key_jobs_url(workspace_id, key: str, **more) -> str:
    """The job list of one workspace's key."""
    return reverse("admin:jobqueue_job_changelist") + "?" + urlencode(
        {"workspace__id__exact": str(workspace_id), "concurrency_key": key, **more})


class ConcurrencyViews:
    """Mixed into JobAdmin (jobs.py): the Concurrency keys page, with the view permission on
    jobs."""

    def get_urls(self):
        wrap = self.admin_site.admin_view
        return [
            path("concurrency/", wrap(self.concurrency_view), name="jobqueue_job_concurrency"),
        ] + super().get_urls()

    def concurrency_view(self, request):
        if not self.has_view_permission(request):
            raise PermissionDenied
        context = {
            **self.admin_site.each_context(request),
            **concurrency_context(),
            "title": "Concurrency keys",
            "opts": self.opts,
            "changelist_url": reverse("admin:jobqueue_job_changelist"),
        }
        return TemplateResponse(request, "admin/jobqueue/concurrency.html", context)


def concurrency_context() -> dict:
    keys = busiest_keys(CONCURRENCY_ROWS)
    names = dict(Workspace.objects.filter(id__in={k.workspace_id for k in keys})
                 .values_list("id", "name"))
    return {
        "rows": [
            {
                "workspace": names.get(k.workspace_id, k.workspace_id),
                "key": k.key,
                "running": k.running,
                "limit": "—" if k.limit is None else k.limit,
                "waiting": k.waiting,
                "held": k.held,
                "jobs_url": key_jobs_url(k.workspace_id, k.key),
                "running_url": key_jobs_url(k.workspace_id, k.key,
                                            status__exact=states.IN_PROGRESS),
                "held_url": key_jobs_url(k.workspace_id, k.key, concurrency="held"),
            }
            for k in keys
        ],
        "most": CONCURRENCY_ROWS,
        "held_url": reverse("admin:jobqueue_job_changelist") + "?concurrency=held",
    }
