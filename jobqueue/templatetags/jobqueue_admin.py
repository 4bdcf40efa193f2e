"""The admin index's "Needs attention" panel: the counts of the Recovery page, linked to it."""

from django import template
from django.urls import reverse

from jobqueue.admin.common import request_db_now
from jobqueue.admin.recovery import attention

register = template.Library()


@register.inclusion_tag("admin/jobqueue/attention_panel.html", takes_context=True)
def attention_panel(context):
    request = context["request"]
    if not request.user.has_perm("jobqueue.view_job"):
        return {"shown": False}
    items = attention(request_db_now(request))
    return {
        "shown": True,
        "items": items,
        "all_clear": not any(item["count"] for item in items),
        "recovery_url": reverse("admin:jobqueue_job_recovery"),
    }
