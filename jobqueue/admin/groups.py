"""Groups in the admin, on the job list: the group filter and the "cancel the groups of the
selected jobs" action's flow (a confirmation page listing the groups and their live jobs,
then each group's cancel through the lifecycle: jobqueue.lifecycle.cancel_group). JobAdmin
(jobs.py) offers the filter and the action; a group has no admin page of its own.
"""

from __future__ import annotations

import logging

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import Q
from django.template.response import TemplateResponse
from django.urls import reverse

from jobqueue import lifecycle, states
from jobqueue.models import Job, JobGroup

from .common import operator_actor

log = logging.getLogger("jobqueue.admin")
RECENT_GROUPS = 20


class GroupFilter(admin.SimpleListFilter):
    """By group: the most recent groups are offered; any group works as `?group=<name>`."""

    title = "group"
    parameter_name = "group"

    def lookups(self, request, model_admin):
        names = JobGroup.objects.order_by("-created_at").values_list("name", flat=True)
        recent = list(dict.fromkeys(names[: RECENT_GROUPS * 2]))[:RECENT_GROUPS]
        return [(name, name) for name in recent]

    def queryset(self, request, queryset):
        value = self.value()
        return queryset.filter(group=value) if value else queryset


def _cancel_groups_confirmed(model_admin, request, groups):
    actor = operator_actor(request)
    total = 0
    for group in groups:
        n = lifecycle.cancel_group(group.workspace_id, group.name, actor=actor,
                                   reason="Cancelled from the admin.")
        total += n
        model_admin.log_change(request, group,
                               f"Group {group.name} cancelled by {actor}: {n} job(s) cancelled.")
        log.info("group cancelled from the admin: workspace=%s group=%s actor=%s jobs=%d",
                 group.workspace_id, group.name, actor, n)
    model_admin.message_user(
        request, f"Cancelled {len(groups)} group(s): {total} job(s) cancelled.", messages.SUCCESS
    )


def confirm_cancel_groups(model_admin, request, queryset):
    """A confirmation page listing the groups and their live jobs, then each group's cancel
    through the lifecycle (logged: an admin LogEntry per group, and the jobqueue.admin log)."""
    keys = set(queryset.exclude(group=None).values_list("workspace_id", "group"))
    if not keys:
        model_admin.message_user(request, "None of the selected jobs belongs to a group.",
                                 messages.WARNING)
        return None
    q = Q()
    for workspace_id, name in keys:
        q |= Q(workspace_id=workspace_id, name=name)
    groups = list(JobGroup.objects.filter(q).select_related("workspace").order_by("name"))
    if request.POST.get("confirm") == "yes":
        _cancel_groups_confirmed(model_admin, request, groups)
        return None
    for group in groups:
        group.live_jobs = Job.objects.filter(
            workspace_id=group.workspace_id, group=group.name, status__in=states.ACTIVE
        ).count()
    context = {
        **model_admin.admin_site.each_context(request),
        "title": "Cancel these groups?",
        "opts": model_admin.opts,
        "groups": groups,
        "queryset": queryset,
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        "changelist_url": reverse("admin:jobqueue_job_changelist"),
    }
    return TemplateResponse(request, "admin/jobqueue/cancel_groups_confirm.html", context)
