"""The operator's admin: see what is stuck and repair it through the lifecycle functions.

Every repair (requeue, cancel, mark failed, reap now) calls jobqueue.lifecycle or
jobqueue.reaper, never `queryset.update`; each writes a job event naming the operator
(`operator:<username>`) and an admin LogEntry, and needs the change permission. Jobs, claims
and events are read-only here: a job changes status only through those functions.

`dispatch_context` may hold secrets: only its keys are ever rendered. Claim ids (fencing
tokens) are never rendered either.
"""

from __future__ import annotations

import datetime as dt
import json

from django.contrib import admin, messages
from django.contrib.admin.models import ADDITION, LogEntry
from django.core.exceptions import PermissionDenied
from django.db.models import Count, F, Q
from django.db.models.constants import LOOKUP_SEP
from django.db.models.functions import Now
from django.http import HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join

from agents.models import AgentToken

from . import actors, lifecycle, reaper, states
from .conf import jobqueue_settings
from .db import NowPlusSeconds, db_now
from .exceptions import JobQueueError
from .lifecycle.inputs import parse_uuid
from .models import Job, JobAgent, JobClaim, JobEvent, ReaperRun, Workspace

# An agent counts as "not seen" after this many of its lease periods without a request.
AGENT_UNSEEN_LEASE_PERIODS = 3
# "Recently" on the Recovery page.
RECENT = dt.timedelta(days=1)
RECOVERY_ROWS = 50


def operator_actor(request) -> str:
    return actors.operator_actor(request.user.get_username())


def request_db_now(request) -> dt.datetime:
    """The database's clock, read once per request."""
    if not hasattr(request, "_jobqueue_db_now"):
        request._jobqueue_db_now = db_now()
    return request._jobqueue_db_now


def row_db_now(obj) -> dt.datetime:
    """The database's clock as annotated on a row by get_queryset() (`db_now`)."""
    now = getattr(obj, "db_now", None)
    return now if now is not None else db_now()


def humanize_seconds(seconds: float) -> str:
    seconds = abs(int(seconds))
    if seconds < 90:
        return f"{seconds} s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} min"
    if seconds < 36 * 3600:
        return f"{round(seconds / 3600)} h"
    return f"{round(seconds / 86400)} d"


def describe_lease(expires_at, now) -> str:
    """ "expires in 42 s" or "expired 3 min ago", relative to the database's clock."""
    left = (expires_at - now).total_seconds()
    if left > 0:
        return f"expires in {humanize_seconds(left)}"
    return f"expired {humanize_seconds(left)} ago"


def describe_age(when, now, never="never") -> str:
    if when is None:
        return never
    return f"{humanize_seconds((now - when).total_seconds())} ago"


def claim_of(job: Job) -> JobClaim | None:
    try:
        return job.claim
    except JobClaim.DoesNotExist:
        return None


def expiring_soon_cutoff():
    """A lease is "expiring soon" with less than a third of it left (two heartbeats missed
    at the suggested interval). Evaluated by the database, per claim."""
    return NowPlusSeconds(F("claim__lease_seconds") / 3)


# --- workspaces and agents -----------------------------------------------------------------


@admin.register(Workspace)
class WorkspaceAdmin(admin.ModelAdmin):
    list_display = ["name", "id", "agent_count", "created_at"]
    search_fields = ["name", "=id"]
    readonly_fields = ["id", "created_at"]
    fields = ["id", "name", "created_at"]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(agent_count=Count("job_agents"))

    @admin.display(description="job agents", ordering="agent_count")
    def agent_count(self, obj):
        return obj.agent_count

    def get_search_results(self, request, queryset, search_term):
        return _name_or_id_search(queryset, search_term)


class AgentTokenInline(admin.TabularInline):
    """The agent's credentials, read-only: issue and revoke from the agent token admin."""

    model = AgentToken
    fields = ["name", "masked_prefix", "created_at", "revoked_at"]
    readonly_fields = fields
    extra = 0
    max_num = 0
    can_delete = False
    show_change_link = True
    verbose_name = "credential"
    verbose_name_plural = "credentials (issue and revoke under Agent tokens)"

    @admin.display(description="token")
    def masked_prefix(self, obj):
        return f"jqa_{obj.prefix}_…"

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


def _lease_bounds_validator(field):
    from django.core.exceptions import ValidationError

    from .exceptions import InvalidInput

    check = {
        "lease_seconds": lifecycle.validate_lease_seconds,
        "max_attempts": lifecycle.validate_max_attempts,
    }[field]

    def clean(self):
        value = self.cleaned_data.get(field)
        try:
            return check(value)
        except InvalidInput as exc:
            raise ValidationError(exc.detail if hasattr(exc, "detail") else str(exc)) from exc

    return clean


@admin.register(JobAgent)
class JobAgentAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "workspace",
        "id",
        "last_seen",
        "in_flight",
        "expired_leases_last_day",
        "lease_display",
        "max_attempts_display",
    ]
    list_filter = ["workspace"]
    list_select_related = ["workspace"]
    search_fields = ["name", "=id"]
    inlines = [AgentTokenInline]
    readonly_fields = [
        "id",
        "type",
        "created_at",
        "last_seen",
        "in_flight",
        "expired_leases_last_day",
        "credential_links",
    ]

    def get_fields(self, request, obj=None):
        head = ["id", "workspace"] if obj is None else ["id", "workspace_display"]
        return head + [
            "name",
            "type",
            "lease_seconds",
            "max_attempts",
            "created_at",
            "last_seen",
            "in_flight",
            "expired_leases_last_day",
            "credential_links",
        ]

    def get_readonly_fields(self, request, obj=None):
        extra = ["workspace_display"] if obj is not None else []
        return self.readonly_fields + extra

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change=change, **kwargs)
        form.clean_lease_seconds = _lease_bounds_validator("lease_seconds")
        form.clean_max_attempts = _lease_bounds_validator("max_attempts")
        return form

    def get_queryset(self, request):
        # The same health numbers as the API's job-agent detail (agents.health).
        from agents.health import with_health

        return with_health(super().get_queryset(request)).annotate(db_now=Now())

    def get_search_results(self, request, queryset, search_term):
        return _name_or_id_search(queryset, search_term)

    @admin.display(description="workspace")
    def workspace_display(self, obj):
        return obj.workspace

    @admin.display(description="last seen", ordering="last_seen_at")
    def last_seen(self, obj):
        return describe_age(obj.last_seen_at, row_db_now(obj))

    @admin.display(description="jobs in flight", ordering="jobs_in_flight")
    def in_flight(self, obj):
        return obj.jobs_in_flight

    @admin.display(description="leases expired (last day)", ordering="leases_expired_24h")
    def expired_leases_last_day(self, obj):
        return obj.leases_expired_24h

    @admin.display(description="lease")
    def lease_display(self, obj):
        suffix = "" if obj.lease_seconds else " (default)"
        return f"{obj.effective_lease_seconds} s{suffix}"

    @admin.display(description="max attempts")
    def max_attempts_display(self, obj):
        suffix = "" if obj.max_attempts else " (default)"
        return f"{obj.effective_max_attempts}{suffix}"

    @admin.display(description="credentials")
    def credential_links(self, obj):
        if obj.pk is None:
            return "Save the agent first, then issue a token."
        add = reverse("admin:agents_agenttoken_add") + f"?job_agent={obj.pk}"
        listing = reverse("admin:agents_agenttoken_changelist") + f"?job_agent__id__exact={obj.pk}"
        return format_html(
            '<a href="{}">Issue a token</a> (shown once) · <a href="{}">All tokens (revoke)</a>',
            add,
            listing,
        )



def _name_or_id_search(queryset, search_term):
    """Name contains the term, or the id equals it (a term that is not a UUID never 500s)."""
    term = search_term.strip()
    if not term:
        return queryset, False
    q = Q(name__icontains=term)
    if (term_id := parse_uuid(term)) is not None:
        q |= Q(id=term_id)
    return queryset.filter(q), False


# --- jobs ------------------------------------------------------------------------------------


class LeaseStateFilter(admin.SimpleListFilter):
    title = "lease"
    parameter_name = "lease"

    def lookups(self, request, model_admin):
        return [
            ("healthy", "healthy"),
            ("expiring", "expiring soon (< 1/3 of the lease left)"),
            ("expired", "expired, not yet reaped"),
            ("none", "none (no claim)"),
        ]

    def queryset(self, request, queryset):
        value = self.value()
        if value == "healthy":
            return queryset.filter(claim__claim_expires_at__gt=expiring_soon_cutoff())
        if value == "expiring":
            return queryset.filter(
                claim__claim_expires_at__gt=Now(),
                claim__claim_expires_at__lte=expiring_soon_cutoff(),
            )
        if value == "expired":
            return queryset.filter(claim__claim_expires_at__lte=Now())
        if value == "none":
            return queryset.filter(claim__isnull=True)
        return queryset


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "job_agent",
        "status",
        "attempts",
        "lease",
        "last_heartbeat",
        "created_at",
    ]
    list_filter = ["status", "job_agent", "workspace", LeaseStateFilter]
    list_select_related = ["job_agent", "claim"]
    search_fields = ["=id", "=idempotency_key", "=external_id"]
    search_help_text = "Search by job id, idempotency key or external id (exact)."
    actions = ["requeue_jobs", "cancel_jobs", "mark_jobs_failed"]
    # Never filterable from the query string: a `?dispatch_context__key__startswith=` would
    # be a character-by-character oracle on a secret (and the same for the fencing token).
    hidden_lookups = frozenset({"dispatch_context", "last_claim_id", "idempotency_fingerprint"})

    def lookup_allowed(self, lookup, value, request=None):
        if lookup.split(LOOKUP_SEP, 1)[0] in self.hidden_lookups:
            return False
        return super().lookup_allowed(lookup, value, request)
    show_full_result_count = False
    fields = [
        "id",
        "workspace",
        "job_agent",
        "status",
        "attempts",
        "priority",
        "available_at",
        "created_at",
        "started_at",
        "completed_at",
        "updated_at",
        "external_id",
        "idempotency_key",
        "message",
        "job_agent_config_display",
        "dispatch_context_keys",
        "result_display",
        "claim_display",
        "timeline",
    ]
    readonly_fields = fields

    # Read-only records: a job moves only through the lifecycle actions.
    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        # The change permission allows the actions (obj is None); the detail page of a
        # job is always view-only.
        if obj is not None:
            return False
        return super().has_change_permission(request)

    def can_act(self, request) -> bool:
        return super().has_change_permission(request)

    def get_queryset(self, request):
        # Never load dispatch_context, the claim token or the idempotency fingerprint.
        return (
            super()
            .get_queryset(request)
            .defer("dispatch_context", "idempotency_fingerprint", "last_claim_id")
            .annotate(db_now=Now())
        )

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if not term:
            return queryset, False
        q = Q(idempotency_key=term) | Q(external_id=term)
        if (term_id := parse_uuid(term)) is not None:
            q |= Q(id=term_id)
        return queryset.filter(q), False

    # --- columns

    @admin.display(description="attempt / max")
    def attempts(self, obj):
        return f"{obj.attempt} / {obj.max_attempts}"

    @admin.display(description="lease")
    def lease(self, obj):
        claim = claim_of(obj)
        if claim is None:
            return "—"
        text = describe_lease(claim.claim_expires_at, row_db_now(obj))
        if claim.claim_expires_at <= row_db_now(obj):
            return format_html('<strong class="jq-expired">{}</strong>', text)
        return text

    @admin.display(description="last heartbeat")
    def last_heartbeat(self, obj):
        claim = claim_of(obj)
        if claim is None:
            return "—"
        return describe_age(claim.heartbeat_at, row_db_now(obj), never="none yet")

    # --- detail fields

    @admin.display(description="job agent config")
    def job_agent_config_display(self, obj):
        return format_html("<pre>{}</pre>", json.dumps(obj.job_agent_config, indent=2))

    @admin.display(description="dispatch context (keys only; values are never shown)")
    def dispatch_context_keys(self, obj):
        keys = (
            Job.objects.filter(pk=obj.pk).values_list("dispatch_context", flat=True).first()
        ) or {}
        if not isinstance(keys, dict):
            return f"({type(keys).__name__}, redacted)"
        if not keys:
            return "(empty)"
        return format_html_join(", ", "<code>{}</code>", ((k,) for k in sorted(keys)))

    @admin.display(description="result")
    def result_display(self, obj):
        if obj.result is None:
            return "—"
        return format_html("<pre>{}</pre>", json.dumps(obj.result, indent=2))

    @admin.display(description="claim")
    def claim_display(self, obj):
        claim = claim_of(obj)
        if claim is None:
            return "No claim."
        now = row_db_now(obj)
        rows = [
            ("attempt", claim.attempt),
            ("claimed", f"{claim.claimed_at:%Y-%m-%d %H:%M:%S} UTC"),
            ("lease", f"{claim.lease_seconds} s"),
            ("expiry", f"{claim.claim_expires_at:%Y-%m-%d %H:%M:%S} UTC "
                       f"({describe_lease(claim.claim_expires_at, now)})"),
            ("last heartbeat", describe_age(claim.heartbeat_at, now, never="none yet")),
            ("agent", claim.job_agent_id),
        ]
        return format_html(
            '<table class="jq-claim">{}</table>',
            format_html_join("", "<tr><th>{}</th><td>{}</td></tr>", rows),
        )

    @admin.display(description="timeline")
    def timeline(self, obj):
        events = JobEvent.objects.filter(job_id=obj.pk).only(
            "created_at", "kind", "attempt", "actor", "detail"
        )
        rows = (
            (
                f"{e.created_at:%Y-%m-%d %H:%M:%S.%f}"[:-3],
                e.get_kind_display(),
                e.attempt,
                e.actor or "—",
                _format_detail(e.detail),
            )
            for e in events
        )
        return format_html(
            '<table class="jq-timeline"><thead><tr><th>time (UTC)</th><th>event</th>'
            "<th>attempt</th><th>actor</th><th>detail</th></tr></thead><tbody>{}</tbody>"
            "</table>",
            format_html_join(
                "", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", rows
            ),
        )

    def changelist_view(self, request, extra_context=None):
        extra_context = {
            **(extra_context or {}),
            "recovery_url": reverse("admin:jobqueue_job_recovery"),
            "reap_url": reverse("admin:jobqueue_job_reap"),
            "can_act": self.can_act(request),
        }
        return super().changelist_view(request, extra_context)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        extra_context = {
            **(extra_context or {}),
            "can_act": self.can_act(request),
            "changelist_url": reverse("admin:jobqueue_job_changelist"),
        }
        return super().change_view(request, object_id, form_url, extra_context)

    # --- actions

    def _run_action(self, request, queryset, func, verb, reason):
        actor = operator_actor(request)
        done, refused = 0, []
        for job_id, status in queryset.values_list("id", "status"):
            if func is lifecycle.cancel_job and status == states.CANCELLED:
                refused.append(f"{job_id}: already cancelled")  # cancel_job is a no-op
                continue
            try:
                job = func(job_id, actor=actor, reason=reason)
            except JobQueueError as exc:
                refused.append(f"{job_id}: {exc}")
                continue
            self.log_change(request, job, f"{verb} by {actor} (status now {job.status}).")
            done += 1
        if done:
            self.message_user(request, f"{verb} {done} job(s).", messages.SUCCESS)
        if refused:
            self.message_user(
                request,
                f"{len(refused)} job(s) left unchanged: " + "; ".join(refused[:10]),
                messages.WARNING,
            )

    @admin.action(description="Requeue selected jobs (supersedes a live claim)",
                  permissions=["change"])
    def requeue_jobs(self, request, queryset):
        self._run_action(request, queryset, lifecycle.requeue_job, "Requeued",
                         "Requeued from the admin.")

    @admin.action(description="Cancel selected jobs", permissions=["change"])
    def cancel_jobs(self, request, queryset):
        self._run_action(request, queryset, lifecycle.cancel_job, "Cancelled",
                         "Cancelled from the admin.")

    @admin.action(description="Mark selected jobs failed", permissions=["change"])
    def mark_jobs_failed(self, request, queryset):
        self._run_action(request, queryset, lifecycle.mark_failed, "Marked failed",
                         "Marked failed from the admin.")

    # --- custom views

    def get_urls(self):
        wrap = self.admin_site.admin_view
        return [
            path("recovery/", wrap(self.recovery_view), name="jobqueue_job_recovery"),
            path("reap/", wrap(self.reap_view), name="jobqueue_job_reap"),
        ] + super().get_urls()

    def recovery_view(self, request):
        if not self.has_view_permission(request):
            raise PermissionDenied
        context = {
            **self.admin_site.each_context(request),
            **recovery_context(request),
            "title": "Recovery",
            "opts": self.opts,
            "can_act": self.can_act(request),
            "changelist_url": reverse("admin:jobqueue_job_changelist"),
            "reap_url": reverse("admin:jobqueue_job_reap"),
        }
        return TemplateResponse(request, "admin/jobqueue/recovery.html", context)

    def reap_view(self, request):
        """Reap expired leases now: a confirmation page (GET), then one sweep (POST)."""
        if not self.can_act(request):
            raise PermissionDenied
        if request.method == "POST":
            actor = operator_actor(request)
            result = reaper.sweep(actor=actor)
            run = ReaperRun.objects.get(pk=result.run_id)
            LogEntry.objects.log_actions(
                user_id=request.user.pk,
                queryset=[run],
                action_flag=ADDITION,
                change_message=(
                    f"Reaped expired leases now ({actor}): requeued {result.requeued}, "
                    f"expired {result.expired}."
                ),
                single_object=True,
            )
            self.message_user(
                request,
                f"Reaper ran: {result.requeued} job(s) requeued, {result.expired} expired.",
                messages.SUCCESS,
            )
            return HttpResponseRedirect(reverse("admin:jobqueue_job_recovery"))
        if request.method != "GET":
            return HttpResponseNotAllowed(["GET", "POST"])
        context = {
            **self.admin_site.each_context(request),
            "title": "Reap expired leases now?",
            "opts": self.opts,
            "counts": lifecycle.count_expired_claims(),
            "recovery_url": reverse("admin:jobqueue_job_recovery"),
        }
        return TemplateResponse(request, "admin/jobqueue/reap_confirm.html", context)


def _format_detail(detail) -> str:
    if not isinstance(detail, dict) or not detail:
        return ""
    return ", ".join(f"{k}={v}" for k, v in sorted(detail.items()))


def recovery_context(request) -> dict:
    """What the Recovery page shows; every time relative to the database's clock."""
    now = request_db_now(request)
    conf = jobqueue_settings()

    counts = dict.fromkeys((value for value, _ in states.CHOICES), 0)
    for row in Job.objects.order_by().values("status").annotate(n=Count("id")):
        counts[row["status"]] = row["n"]

    expired_claims_qs = JobClaim.objects.expired()
    expired_claims = [
        {
            "job_id": c.job_id,
            "agent": c.job_agent.name,
            "attempt": f"{c.job.attempt} / {c.job.max_attempts}",
            "lease": describe_lease(c.claim_expires_at, now),
            "outcome": "expire" if c.job.attempt >= c.job.max_attempts else "requeue",
        }
        for c in expired_claims_qs.select_related("job_agent", "job")
        .only(
            "job_id", "claim_expires_at", "job_agent__name", "job__attempt",
            "job__max_attempts",
        )
        .order_by("claim_expires_at")[:RECOVERY_ROWS]
    ]

    orphans = list(
        Job.objects.filter(status=states.IN_PROGRESS, claim__isnull=True)
        .select_related("job_agent")
        .only("id", "attempt", "max_attempts", "updated_at", "job_agent__name")[:RECOVERY_ROWS]
    )
    orphan_count = Job.objects.filter(status=states.IN_PROGRESS, claim__isnull=True).count()

    recently_expired_qs = Job.objects.filter(
        status=states.EXPIRED, completed_at__gte=now - RECENT
    )
    recently_expired = [
        {
            "job_id": j.id,
            "agent": j.job_agent.name,
            "attempt": f"{j.attempt} / {j.max_attempts}",
            "ended": describe_age(j.completed_at, now),
        }
        for j in recently_expired_qs.select_related("job_agent")
        .only("id", "attempt", "max_attempts", "completed_at", "job_agent__name")
        .order_by("-completed_at")[:RECOVERY_ROWS]
    ]

    unseen_agents = []
    for agent in JobAgent.objects.select_related("workspace").order_by("name"):
        threshold = AGENT_UNSEEN_LEASE_PERIODS * agent.effective_lease_seconds
        if agent.last_seen_at is None or (now - agent.last_seen_at).total_seconds() > threshold:
            unseen_agents.append(
                {
                    "agent": agent,
                    "workspace": agent.workspace.name,
                    "last_seen": describe_age(agent.last_seen_at, now),
                    "threshold": humanize_seconds(threshold),
                }
            )

    runs = list(ReaperRun.objects.order_by("-started_at")[:10])
    stale_after = conf["REAPER_STALE_AFTER_SECONDS"]
    last_run = runs[0] if runs else None
    last_run_at = (last_run.finished_at or last_run.started_at) if last_run else None
    reaper_stale = last_run_at is None or (now - last_run_at).total_seconds() > stale_after
    return {
        "db_now": now,
        "status_counts": [(label, value, counts[value]) for value, label in states.CHOICES],
        "expired_claims": expired_claims,
        "expired_claim_count": expired_claims_qs.count(),
        "orphans": orphans,
        "orphan_count": orphan_count,
        "recently_expired": recently_expired,
        "recently_expired_count": recently_expired_qs.count(),
        "unseen_agents": unseen_agents,
        "unseen_periods": AGENT_UNSEEN_LEASE_PERIODS,
        "reaper_runs": [
            {
                "run": r,
                "ago": describe_age(r.finished_at or r.started_at, now),
                "duration": "—" if r.duration_seconds is None else f"{r.duration_seconds:.3f} s",
            }
            for r in runs
        ],
        "reaper_stale": reaper_stale,
        "reaper_last_run_ago": describe_age(last_run_at, now),
        "reaper_stale_after": humanize_seconds(stale_after),
    }


# --- the reaper's record -----------------------------------------------------------------------


@admin.register(ReaperRun)
class ReaperRunAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "started_at",
        "finished_at",
        "sweeps",
        "duration",
        "batches",
        "requeued",
        "expired",
        "dry_run",
        "host",
        "pid",
        "has_error",
    ]
    list_filter = ["dry_run"]
    readonly_fields = [
        "id",
        "started_at",
        "finished_at",
        "duration_seconds",
        "sweeps",
        "batches",
        "requeued",
        "expired",
        "dry_run",
        "error",
        "host",
        "pid",
    ]
    fields = readonly_fields

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.display(description="duration", ordering="duration_seconds")
    def duration(self, obj):
        return "—" if obj.duration_seconds is None else f"{obj.duration_seconds:.3f} s"

    @admin.display(description="error", boolean=True)
    def has_error(self, obj):
        return bool(obj.error)


