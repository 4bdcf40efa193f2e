"""Jobs in the admin: read-only records with their lease, claim and timeline; repairs are
actions that call the lifecycle (requeue, cancel, mark failed), need the change permission and
write a job event naming the operator and an admin LogEntry.

`dispatch_context` may hold secrets: only its keys are ever rendered, and agent text (message,
result, external id, attempts, event details, logs) is shown through jobqueue.redaction.
Claim ids are never rendered either, nor filterable from the query string.

Beside it: the group filter and the cancel-groups action's flow (groups.py), the live page's
endpoint (live.py), the Recovery page (recovery.py), the Concurrency keys page and the key
filters (concurrency.py), the Rate limits page and the rate limit key filters (ratelimits.py),
the Fair shares page and the fairness key filters (fairness.py), the timeline's markup
(templates/admin/jobqueue/job/timeline.html) and a log tail's redaction
(jobqueue.lifecycle.logs, LogSlice.redacted_text).
"""

from __future__ import annotations

import json

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.db.models import F, Q
from django.db.models.functions import Now
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from jobqueue import history, lifecycle, states, timeline
from jobqueue.db import NowPlusSeconds
from jobqueue.exceptions import JobQueueError
from jobqueue.lifecycle import dependencies, fairness, logs, ratelimits
from jobqueue.models import Job, JobArtifact, JobDependency, JobEffect, JobEvent
from jobqueue.redaction import redact_text, redact_value, secret_strings

from .common import (
    OfferedFiltersOnly,
    claim_of,
    describe_age,
    describe_lease,
    id_or,
    operator_actor,
    row_db_now,
)
from .concurrency import ConcurrencyFilter, ConcurrencyKeyFilter, ConcurrencyViews, key_jobs_url
from .fairness import FairnessFilter, FairnessKeyFilter, FairnessViews, fair_key_jobs_url
from .groups import GroupFilter, confirm_cancel_groups
from .live import LIVE_POLL_MS, LiveJobViews
from .ratelimits import RateLimitFilter, RateLimitKeyFilter, RateLimitViews, rate_key_jobs_url
from .recovery import RecoveryViews


def expiring_soon_cutoff():
    """A lease is "expiring soon" with less than a third of it left (two heartbeats missed
    at the suggested interval). Evaluated by the database, per claim."""
    return NowPlusSeconds(F("claim__lease_seconds") / 3)


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


# The job list shows none of the columns a job may hold in bulk (result and message up to
# their caps, the producer's job_agent_config): it never loads them.
LIST_DEFERRED = ("result", "message", "job_agent_config")


class JobChangeList(ChangeList):
    def get_queryset(self, request, exclude_parameters=None):
        return super().get_queryset(request, exclude_parameters).defer(*LIST_DEFERRED)


@admin.register(Job)
class JobAdmin(LiveJobViews, RecoveryViews, ConcurrencyViews, RateLimitViews, FairnessViews,
               OfferedFiltersOnly):
    list_display = [
        "id",
        "job_agent",
        "labels_display",
        "status",
        "group",
        "concurrency_column",
        "rate_limit_column",
        "fairness_column",
        "attempts",
        "lease",
        "last_heartbeat",
        "created_at",
    ]
    list_filter = ["status", "job_agent", "workspace", GroupFilter, LeaseStateFilter,
                   ConcurrencyFilter, ConcurrencyKeyFilter, RateLimitFilter, RateLimitKeyFilter,
                   FairnessFilter, FairnessKeyFilter]
    list_select_related = ["job_agent", "claim"]
    search_fields = ["=id", "=idempotency_key", "=external_id"]
    search_help_text = ("Search by job id, idempotency key, external id, concurrency key, "
                        "rate limit key or fairness key (exact).")
    actions = ["requeue_jobs", "cancel_jobs", "mark_jobs_failed", "cancel_groups"]
    show_full_result_count = False
    # The query string filters by list_filter's fields only (OfferedFiltersOnly): never
    # `?dispatch_context__key__startswith=`, a character-by-character oracle on a secret.

    fields = [
        "id",
        "workspace",
        "job_agent",
        "labels_display",
        "status",
        "group",
        "attempts",
        "priority",
        "retry_backoff",
        "max_runtime_seconds",
        "expires_at",
        "available_at",
        "created_at",
        "started_at",
        "completed_at",
        "updated_at",
        "external_id_display",
        "idempotency_key",
        "unique_key",
        "concurrency_display",
        "rate_limit_display",
        "fairness_display",
        "dependencies_display",
        "dependents_display",
        "message_display",
        "job_agent_config_display",
        "dispatch_context_keys",
        "result_display",
        "claim_display",
        "attempt_history",
        "logs_display",
        "artifacts_display",
        "effects_display",
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

    def get_changelist(self, request, **kwargs):
        return JobChangeList

    def get_queryset(self, request):
        # Never load dispatch_context, the claim token or the idempotency fingerprint.
        return (
            super()
            .get_queryset(request)
            .defer("dispatch_context", "idempotency_fingerprint", "last_claim_id")
            .annotate(db_now=Now())
        )

    def get_search_results(self, request, queryset, search_term):
        return id_or(
            queryset, search_term,
            lambda term: (Q(idempotency_key=term) | Q(external_id=term)
                          | Q(concurrency_key=term) | Q(rate_limit_key=term)
                          | Q(fairness_key=term))
        )

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

    @admin.display(description="concurrency key")
    def concurrency_column(self, obj):
        """Its key and limit; "held back" while the key's slots keep it back."""
        if obj.concurrency_key is None:
            return "—"
        if _held(obj):
            return format_html('<code>{}</code> ≤ {} <strong class="jq-held">held back</strong>',
                               obj.concurrency_key, obj.concurrency_limit)
        return format_html("<code>{}</code> ≤ {}", obj.concurrency_key, obj.concurrency_limit)

    @admin.display(description="rate limit key")
    def rate_limit_column(self, obj):
        """Its key; "held back" while the key's window keeps it back."""
        if obj.rate_limit_key is None:
            return "—"
        if _rate_held(obj):
            return format_html('<code>{}</code> <strong class="jq-held">held back</strong>',
                               obj.rate_limit_key)
        return format_html("<code>{}</code>", obj.rate_limit_key)

    @admin.display(description="fairness key")
    def fairness_column(self, obj):
        """Its key (a fairness key holds no job back: it only orders them)."""
        if obj.fairness_key is None:
            return "—"
        return format_html("<code>{}</code>", obj.fairness_key)

    # --- detail fields

    @admin.display(description="concurrency")
    def concurrency_display(self, obj):
        """Its key, its limit, whether the key's slots hold it back (read-only; live)."""
        if obj.concurrency_key is None:
            return "No concurrency key."
        return format_html(
            '<code>{}</code>: at most {} of the workspace\'s jobs with the key in progress at '
            'once.{} <a href="{}">The key\'s jobs</a>', obj.concurrency_key,
            obj.concurrency_limit,
            " Held back: the key's slots are taken; claimable once one frees." if _held(obj)
            else "", key_jobs_url(obj.workspace_id, obj.concurrency_key))

    @admin.display(description="rate limit")
    def rate_limit_display(self, obj):
        """Its key, the key's limit, whether the window holds it back (read-only; live)."""
        if obj.rate_limit_key is None:
            return "No rate limit key."
        limit = ratelimits.get_limit(obj.workspace_id, obj.rate_limit_key)
        return format_html(
            '<code>{}</code>: {}{} <a href="{}">The key\'s jobs</a>', obj.rate_limit_key,
            "no limit set (the key limits nothing)." if limit is None else
            f"at most {limit.count} of the workspace's jobs with the key claimed in any "
            f"{limit.period_seconds} s.",
            " Held back: the key's window is full; claimable once it lets a claim through."
            if _rate_held(obj) else "", rate_key_jobs_url(obj.workspace_id, obj.rate_limit_key))

    @admin.display(description="fair share")
    def fairness_display(self, obj):
        """Its key and the key's weight (read-only)."""
        if obj.fairness_key is None:
            return "No fairness key."
        row = fairness.get_weight(obj.workspace_id, obj.fairness_key)
        return format_html(
            '<code>{}</code>: weight {}. The workspace\'s claims of jobs with a fairness key are '
            'shared among the keys in proportion to their weights, after priority. '
            '<a href="{}">The key\'s jobs</a>', obj.fairness_key,
            f"{fairness.DEFAULT_WEIGHT} (none set)" if row is None else row.weight,
            fair_key_jobs_url(obj.workspace_id, obj.fairness_key))

    @admin.display(description="retry backoff")
    def retry_backoff(self, obj):
        return f"{obj.effective_retry_backoff_seconds} s, doubled per attempt"

    @admin.display(description="labels")
    def labels_display(self, obj):
        """A labelled job's target (its job agent is the one that claimed it last)."""
        return ", ".join(obj.labels) if obj.labels else "-"

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

    def secrets(self, obj) -> list[str]:
        """The dispatch_context's strings, which agent text is shown without
        (jobqueue.redaction); read once per page, never rendered."""
        if not hasattr(obj, "_secrets"):
            obj._secrets = secret_strings(
                Job.objects.filter(pk=obj.pk).values_list("dispatch_context", flat=True).first())
        return obj._secrets

    @admin.display(description="external id")
    def external_id_display(self, obj):
        return redact_text(obj.external_id, self.secrets(obj)) if obj.external_id else "—"

    @admin.display(description="message")
    def message_display(self, obj):
        return redact_text(obj.message, self.secrets(obj)) if obj.message else "—"

    @admin.display(description="result")
    def result_display(self, obj):
        if obj.result is None:
            return "—"
        return format_html("<pre>{}</pre>", json.dumps(redact_value(obj.result,
                                                                    self.secrets(obj)), indent=2))

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
            ("deadline", "none" if claim.deadline_at is None
             else f"{claim.deadline_at:%Y-%m-%d %H:%M:%S} UTC (max_runtime_seconds or "
                  "expires_at: the lease never runs past it)"),
            ("last heartbeat", describe_age(claim.heartbeat_at, now, never="none yet")),
            ("agent", claim.job_agent_id),
            ("holder", claim.holder or "—"),
        ]
        return format_html(
            '<table class="jq-claim">{}</table>',
            format_html_join("", "<tr><th>{}</th><td>{}</td></tr>", rows),
        )

    @admin.display(description="attempts")
    def attempt_history(self, obj):
        secrets = self.secrets(obj)
        rows = [
            (a.number, f"{a.claimed_at:%Y-%m-%d %H:%M:%S} UTC",
             "running" if a.ended_at is None else f"{a.ended_at:%Y-%m-%d %H:%M:%S} UTC",
             a.outcome or "—", redact_text(a.message, secrets) or "—", a.claimed_by or "—",
             a.holder or "—")
            for a in history.attempts(timeline.fresh(obj.pk) or obj)
        ]
        if not rows:
            return "Never claimed."
        head = format_html_join("", "<th>{}</th>", ((h,) for h in (
            "#", "claimed", "ended", "outcome", "message", "claimed by", "holder")))
        return format_html(
            '<table class="jq-attempts"><tr>{}</tr>{}</table>', head,
            format_html_join("", "<tr>" + "<td>{}</td>" * 7 + "</tr>", rows),
        )

    @admin.display(description="logs (each attempt's tail)")
    def logs_display(self, obj):
        tails = logs.log_tails(obj.pk, LOG_TAIL_BYTES)
        if not tails:
            return "No log."
        secrets = self.secrets(obj)
        return format_html_join(
            "", '<p>attempt {} ({} bytes)</p><pre class="jq-log">{}</pre>',
            ((tail.attempt, tail.length, tail.redacted_text(secrets)) for tail in tails))

    @admin.display(description="artifacts")
    def artifacts_display(self, obj):
        rows = [
            (a.name, a.attempt, "published" if a.published_at else a.state, a.size,
             a.sha256[:16] or "—")
            for a in JobArtifact.objects.filter(job_id=obj.pk).order_by("-attempt", "name")
        ]
        if not rows:
            return "No artifacts."
        return format_html(
            '<table class="jq-artifacts"><thead><tr><th>name</th><th>attempt</th><th>state'
            "</th><th>bytes</th><th>sha256</th></tr></thead><tbody>{}</tbody></table>",
            format_html_join(
                "", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", rows),
        )

    @admin.display(description="depends on")
    def dependencies_display(self, obj):
        """The jobs this one waits for (read-only), each with its status: those not yet
        successful are what it waits on while pending."""
        rows = [(reverse("admin:jobqueue_job_change", args=[p["job_id"]]), p["job_id"],
                 p["status"], "waiting on it" if obj.status == states.PENDING
                 and p["status"] != states.SUCCESSFUL else "")
                for p in dependencies.parents(obj)]
        if not rows:
            return "No dependencies."
        return format_html('<ul class="jq-dependencies">{}</ul>', format_html_join(
            "", '<li><a href="{}">{}</a> {} <strong>{}</strong></li>', rows))

    @admin.display(description="dependents")
    def dependents_display(self, obj):
        """The jobs that depend on this one (read-only), at most 100, each with its status."""
        if not obj.has_dependents:
            return "No dependents."
        rows = [(reverse("admin:jobqueue_job_change", args=[child_id]), child_id, status)
                for child_id, status in JobDependency.objects.filter(parent_id=obj.pk)
                .order_by("child_id").values_list("child_id", "child__status")[:100]]
        return format_html('<ul class="jq-dependents">{}</ul>', format_html_join(
            "", '<li><a href="{}">{}</a> {}</li>', rows))

    @admin.display(description="effects")
    def effects_display(self, obj):
        """The job's effect ledger (docs/effects.md), oldest first: read-only; a result is
        agent text, redacted as every other (jobqueue.redaction)."""
        secrets = self.secrets(obj)
        rows = [
            (e.key, e.id, "committed" if e.committed else "begun, outcome unknown",
             e.attempt if e.earlier_attempt is None else f"{e.attempt} (after {e.earlier_attempt})",
             "—" if e.committed_attempt is None else e.committed_attempt,
             "—" if not e.committed else json.dumps(redact_value(e.result, secrets)))
            for e in JobEffect.objects.filter(job_id=obj.pk).order_by("begun_at", "key")
        ]
        if not rows:
            return "No effects."
        return format_html(
            '<table class="jq-effects"><thead><tr><th>key</th><th>effect_id</th><th>state</th>'
            "<th>begun by attempt</th><th>committed by</th><th>result</th></tr></thead>"
            "<tbody>{}</tbody></table>",
            format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
                             "<td><code>{}</code></td></tr>", rows),
        )

    def get_object(self, request, object_id, from_field=None):
        obj = super().get_object(request, object_id, from_field)
        if obj is not None:
            # The timeline page asked for (the field renders from the object alone).
            obj.timeline_before = _positive_int(request.GET.get(TIMELINE_PARAM))
        return obj

    @admin.display(description="timeline")
    def timeline(self, obj):
        """The job's events, TIMELINE_PAGE_SIZE at a time: the newest page first, each in
        time order, with links to older and newer pages (keyset on the event id)."""
        before = getattr(obj, "timeline_before", None)
        events = JobEvent.objects.filter(job_id=obj.pk).only(
            "id", "created_at", "kind", "attempt", "actor", "detail", "count", "last_at",
            "holder",
        )
        total = events.count()
        page = events.filter(id__lt=before) if before else events
        page = list(page.order_by("-id")[: TIMELINE_PAGE_SIZE + 1])
        has_older = len(page) > TIMELINE_PAGE_SIZE
        # In time order (an event row written late, jobqueue/timeline.py, has a later id).
        page = sorted(page[:TIMELINE_PAGE_SIZE], key=lambda e: (e.created_at, e.id))
        # The fields it reads in one query (the change form's object defers last_claim_id).
        derived = timeline.said(timeline.fresh(obj.pk) or obj)
        total += len(derived)
        # Read from the job row (jobqueue/timeline.py): each on the page its time falls in.
        later = events.filter(id__gte=before) if before else None
        page = timeline.merged(page, [e for e in derived
                                      if _on_page(e, page, later, has_older)])
        rows = [
            (
                f"{e.created_at:%Y-%m-%d %H:%M:%S.%f}"[:-3],
                e.get_kind_display(),
                e.attempt,
                e.actor or "—",
                e.holder or "—",
                _format_detail(e.detail, self.secrets(obj)),
                _format_count(e),
            )
            for e in page
        ]
        links = []
        if before:
            newer = events.filter(id__gte=before).order_by("id").values_list("id", flat=True)
            after = list(newer[TIMELINE_PAGE_SIZE: TIMELINE_PAGE_SIZE + 1])
            links.append({"href": "?", "label": "newest"})
            if after:
                links.append({"href": f"?{TIMELINE_PARAM}={after[0]}", "label": "newer"})
        if has_older:
            oldest = min(e.id for e in page if e.pk is not None)
            links.append({"href": f"?{TIMELINE_PARAM}={oldest}", "label": "older"})
        return render_to_string(TIMELINE_TEMPLATE, {
            "shown": len(page), "total": total, "links": links, "rows": rows,
        })

    def changelist_view(self, request, extra_context=None):
        extra_context = {
            **(extra_context or {}),
            "recovery_url": reverse("admin:jobqueue_job_recovery"),
            "reap_url": reverse("admin:jobqueue_job_reap"),
            "concurrency_url": reverse("admin:jobqueue_job_concurrency"),
            "rate_limits_url": reverse("admin:jobqueue_job_ratelimits"),
            "fair_shares_url": reverse("admin:jobqueue_job_fairness"),
            "can_act": self.can_act(request),
        }
        return super().changelist_view(request, extra_context)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        extra_context = {
            **(extra_context or {}),
            "can_act": self.can_act(request),
            "changelist_url": reverse("admin:jobqueue_job_changelist"),
            # The live page (live.py): the page polls this while the job is not terminal.
            "live_url": reverse("admin:jobqueue_job_live", args=[object_id]),
            "live_poll_ms": LIVE_POLL_MS,
            "terminal_statuses": sorted(states.TERMINAL),
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

    @admin.action(description="Cancel the groups of the selected jobs (asks first)",
                  permissions=["change"])
    def cancel_groups(self, request, queryset):
        return confirm_cancel_groups(self, request, queryset)


def _held(job) -> bool:
    """Held back by its concurrency key now (the triggers of migration 0027 keep the mark)."""
    return job.status == states.QUEUED and bool(job.concurrency_held)


def _rate_held(job) -> bool:
    """Held back by its rate limit now (the triggers of migration 0029 keep the mark)."""
    return job.status == states.QUEUED and bool(job.rate_held)


LOG_TAIL_BYTES = 4096


TIMELINE_PAGE_SIZE = 100
TIMELINE_PARAM = "timeline_before"
TIMELINE_TEMPLATE = "admin/jobqueue/job/timeline.html"


def _positive_int(value) -> int | None:
    """The id a timeline link carries, or None (the newest page) for anything else."""
    if value is None or not (value.isascii() and value.isdigit()) or len(value) > 18:
        return None
    return int(value) or None


def _on_page(derived: JobEvent, page: list, newer, has_older: bool) -> bool:
    """Whether the derived event falls on this page of stored events (oldest first):
    after its oldest (or it is the oldest page) and before the first newer stored event
    (`newer`: those from the next page on, None on the newest page)."""
    if has_older and page and derived.created_at < page[0].created_at:
        return False
    if newer is None:
        return True
    first = newer.order_by(*timeline.TIME_ORDER).values_list("created_at", flat=True).first()
    return first is None or derived.created_at < first


def _format_count(e: JobEvent) -> str:
    if e.count <= 1:
        return ""
    return f"×{e.count}, the last at {e.last_at:%Y-%m-%d %H:%M:%S} UTC"


def _format_detail(detail, secrets: list[str]) -> str:
    """An event's detail, its agent text redacted (a message there is cut to a size)."""
    if not isinstance(detail, dict) or not detail:
        return ""
    detail = redact_value(detail, secrets)
    if isinstance(detail.get("message"), str):
        detail["message"] = redact_text(detail["message"], secrets)
    return ", ".join(f"{k}={v}" for k, v in sorted(detail.items()))
