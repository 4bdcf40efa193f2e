"""The live job page: while a job is not terminal, its change page polls
`<job>/live/` (staff with the view permission on jobs) and swaps in the fields that move:
status, attempts, times, the claim, the attempt history, the artifacts and the log tail.

The endpoint answers JSON: `{"status", "terminal", "fields": {name: html}}`, each field
rendered by the very admin method (or model field) the page renders it with, so what the
live page shows is what a reload would show: the same redaction of the dispatch_context's
secrets in the message, the result and the log tail (jobqueue.redaction), never a claim id,
only the context's keys.
"""

from __future__ import annotations

from django.contrib.admin.utils import display_for_field, lookup_field
from django.http import JsonResponse
from django.template.defaultfilters import linebreaksbr
from django.urls import path
from django.utils.html import conditional_escape

from jobqueue import states

# What a running job changes, in the order the page shows them.
LIVE_FIELDS = ("status", "attempts", "started_at", "completed_at", "updated_at",
               "concurrency_display", "rate_limit_display", "message_display",
               "result_display", "claim_display", "attempt_history", "logs_display",
               "artifacts_display")
# How often the page asks, in milliseconds (one small request per open page).
LIVE_POLL_MS = 2000


class LiveJobViews:
    """Mixed into JobAdmin (jobs.py): the live endpoint and what the change page needs."""

    def get_urls(self):
        wrap = self.admin_site.admin_view
        return [
            path("<path:object_id>/live/", wrap(self.live_view), name="jobqueue_job_live"),
        ] + super().get_urls()

    def live_view(self, request, object_id):
        if request.method != "GET":
            return JsonResponse({"code": "method_not_allowed", "detail": "GET only."},
                                status=405, headers={"Allow": "GET"})
        if not self.has_view_permission(request):
            return JsonResponse({"code": "permission_denied",
                                 "detail": "You may not view jobs."}, status=403)
        job = self.get_object(request, object_id)
        if job is None:
            return JsonResponse({"code": "not_found", "detail": "No such job."}, status=404)
        return JsonResponse({
            "status": job.status,
            "terminal": job.status in states.TERMINAL,
            "fields": {name: self.live_field(job, name) for name in LIVE_FIELDS},
        })

    def live_field(self, job, name: str) -> str:
        """One read-only field as the change page renders it (escaped HTML): what
        django.contrib.admin.helpers.AdminReadonlyField.contents does for our fields (admin
        methods and plain model fields; the live ones hold no relation)."""
        field, _, value = lookup_field(name, job, self)
        if field is not None:
            value = linebreaksbr(display_for_field(value, field, self.get_empty_value_display()))
        elif not hasattr(value, "__html__"):
            value = linebreaksbr(value)
        return str(conditional_escape(value))
