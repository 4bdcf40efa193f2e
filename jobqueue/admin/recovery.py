"""The Recovery page (what is stuck, and whether the reaper runs) and "reap expired leases
now" (a confirmation page, then one reaper sweep), both beside the job list in the admin.
Every time on them is relative to the database's clock."""

from __future__ import annotations

import datetime as dt

from django.contrib import messages
from django.contrib.admin.models import ADDITION, LogEntry
from django.core.exceptions import PermissionDenied
from django.db.models import Count
from django.http import HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse

from jobqueue import lifecycle, states
from jobqueue.conf import jobqueue_settings
from jobqueue.maintenance import loop as maintenance
from jobqueue.maintenance import reaper
from jobqueue.maintenance.run_records import last_runs
from jobqueue.models import Job, JobAgent, JobClaim, ReaperRun

from .charts import charts_context
from .common import describe_age, describe_lease, operator_actor, request_db_now, seconds_span
from .runs import run_duration

# An agent counts as "not seen" after this many of its lease periods without a request.
AGENT_UNSEEN_LEASE_PERIODS = 3
# "Recently" on the Recovery page.
RECENT = dt.timedelta(days=1)
RECOVERY_ROWS = 50


class RecoveryViews:
    """The job admin's own pages (mixed into JobAdmin): the Recovery page needs the view
    permission on jobs, reap-now the change permission (`can_act`)."""

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
            "changelist_url": reverse("admin:jobqueue_job_changelist"),
            "recovery_url": reverse("admin:jobqueue_job_recovery"),
        }
        return TemplateResponse(request, "admin/jobqueue/reap_confirm.html", context)


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
            # a labelled job that expired before any claim names no agent: its labels
            "agent": j.job_agent.name if j.job_agent is not None else ", ".join(j.labels or []),
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
                    "threshold": seconds_span(threshold),
                }
            )

    runs = list(ReaperRun.objects.order_by("-started_at")[:10])
    stale_after = conf["REAPER_STALE_AFTER_SECONDS"]
    last_run = runs[0] if runs else None
    last_run_at = _last_run_at(last_run)
    reaper_stale = _is_stale(last_run_at, now, stale_after)
    return {
        **charts_context(now),
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
        "paused_agents": [
            {"agent": a, "workspace": a.workspace.name, "since": describe_age(a.paused_at, now)}
            for a in JobAgent.objects.filter(paused_at__isnull=False)
            .select_related("workspace").order_by("paused_at")[:RECOVERY_ROWS]
        ],
        "reaper_runs": [
            {
                "run": r,
                "ago": describe_age(r.finished_at or r.started_at, now),
                "duration": run_duration(r),
            }
            for r in runs
        ],
        "maintenance": maintenance_rows(now, last_run),
        "reaper_stale": reaper_stale,
        "reaper_last_run_ago": describe_age(last_run_at, now),
        "reaper_stale_after": seconds_span(stale_after),
    }


def _last_run_at(run):
    return (run.finished_at or run.started_at) if run else None


def _is_stale(last_run_at, now, stale_after) -> bool:
    return last_run_at is None or (now - last_run_at).total_seconds() > stale_after


def unseen_agent_count(now) -> int:
    rows = JobAgent.objects.values_list("last_seen_at", "lease_seconds")
    default = jobqueue_settings()["DEFAULT_LEASE_SECONDS"]
    return sum(
        1 for seen, lease in rows
        if seen is None
        or (now - seen).total_seconds() > AGENT_UNSEEN_LEASE_PERIODS * (lease or default)
    )


def attention(now) -> list[dict]:
    """The counts that need an operator, for the panel on the admin index: each with its
    label, its count, and whether it is an alarm (a broken invariant) or a warning."""
    conf = jobqueue_settings()
    last_run_at = _last_run_at(ReaperRun.objects.order_by("-started_at").first())
    stale = _is_stale(last_run_at, now, conf["REAPER_STALE_AFTER_SECONDS"])
    orphans = Job.objects.filter(status=states.IN_PROGRESS, claim__isnull=True).count()
    return [
        {"id": "orphans", "label": "in progress without a claim (broken invariant)",
         "count": orphans, "level": "alarm"},
        {"id": "expired-leases", "label": "expired leases not yet reaped",
         "count": JobClaim.objects.expired().count(), "level": "warn"},
        {"id": "recently-expired", "label": "jobs expired in the last 24 hours",
         "count": Job.objects.filter(status=states.EXPIRED,
                                     completed_at__gte=now - RECENT).count(),
         "level": "warn"},
        {"id": "unseen-agents", "label": "job agents not seen lately",
         "count": unseen_agent_count(now), "level": "warn"},
        {"id": "paused-agents", "label": "job agents paused",
         "count": JobAgent.objects.filter(paused_at__isnull=False).count(), "level": "warn"},
        {"id": "reaper-stale", "label": "reaper stale: no sweep lately (last: "
         f"{describe_age(last_run_at, now)})", "count": int(stale), "level": "alarm"},
    ]


def maintenance_rows(now, last_reaper_run) -> list[dict]:
    """Each maintenance service: when it last ran and what it did (the reaper's from
    reaper_run), and its last error when that came later."""
    rows = []
    for service in maintenance.SERVICES:
        name = service.SERVICE
        ok, failed = last_runs(name)
        if name == "reaper":
            ok = last_reaper_run
        when = (ok.finished_at or ok.started_at) if ok else None
        if ok is None:
            did = "never ran"
        elif name == "reaper":
            did = f"requeued {ok.requeued}, expired {ok.expired}"
        else:
            did = ", ".join(f"{k} {v}" for k, v in ok.counts.items() if not isinstance(v, dict))
        rows.append({
            "service": name,
            "ago": describe_age(when, now),
            "did": did,
            "runs": (ok.sweeps if name == "reaper" else ok.runs) if ok else 0,
            "every": seconds_span(service.interval_seconds()),
            "error": failed.error if failed and (when is None or failed.finished_at > when)
            else "",
        })
    return rows
