"""The edge's admin: job agents with their health and credentials, and the credentials
themselves (agent tokens, workspace API keys).

Credentials: issue (the secret is shown once, on the page that issues it) and revoke. Only the
SHA-256 and a lookup prefix are stored; nothing here can show a secret again.

Job agents are administered here, not in the core's admin, because their pages show what only
the edge knows (agents.health, the tokens); the URLs are the model's (admin:jobqueue_jobagent_*).
"""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models.functions import Now
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html

from jobqueue import lifecycle
from jobqueue.admin.common import (
    OfferedFiltersOnly,
    describe_age,
    name_or_id_search,
    operator_actor,
    row_db_now,
)
from jobqueue.exceptions import InvalidInput
from jobqueue.lifecycle import inputs
from jobqueue.models import JobAgent, Workspace

from . import credentials, registration
from .health import with_health
from .models import AgentToken, RegistrationToken, WorkspaceApiKey


def masked(kind: str, row) -> str:
    """How a credential is shown: its kind and lookup prefix, never the secret."""
    return f"{kind}_{row.prefix}_…"


class RevokedFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return [("active", "active"), ("revoked", "revoked")]

    def queryset(self, request, queryset):
        if self.value() == "active":
            return queryset.filter(revoked_at__isnull=True)
        if self.value() == "revoked":
            return queryset.filter(revoked_at__isnull=False)
        return queryset


class HashedSecretAdmin(OfferedFiltersOnly):
    """A model holding a secret's hash (credentials, registration tokens): the stored hash is
    never filterable from the query string (a guessing oracle; no list_filter offers it)."""


class CredentialAdmin(HashedSecretAdmin):
    """Shared by agent tokens and workspace API keys.

    The add page issues a credential and shows its secret once (never stored in a message,
    a log entry or a cookie; the response is not cached). The change page is read-only;
    revocation is an action that needs the change permission.
    """

    owner_field: str
    owner_model: type
    kind: str
    issue = None  # staticmethod(owner, name) -> (row, raw)
    revoke = None  # staticmethod(row) -> row

    list_filter = [RevokedFilter]
    actions = ["revoke_selected"]
    search_fields = ["name", "prefix"]

    def get_readonly_fields(self, request, obj=None):
        return [self.owner_field, "name", "masked", "created_at", "revoked_at"]

    def get_fields(self, request, obj=None):
        return [self.owner_field, "name", "masked", "created_at", "revoked_at"]

    def has_change_permission(self, request, obj=None):
        if obj is not None:  # the detail page is read-only; revoke with the action
            return False
        return super().has_change_permission(request)

    def has_delete_permission(self, request, obj=None):
        return False  # revoke instead: the row stays as the record of the credential

    @admin.display(description="credential")
    def masked(self, obj):
        return masked(self.kind, obj)

    @admin.display(description="active", boolean=True)
    def active(self, obj):
        return obj.revoked_at is None

    @admin.action(description="Revoke selected credentials", permissions=["change"])
    def revoke_selected(self, request, queryset):
        revoked = 0
        for row in queryset.filter(revoked_at__isnull=True):
            type(self).revoke(row)
            self.log_change(request, row, f"Revoked by {operator_actor(request)}.")
            revoked += 1
        self.message_user(request, f"Revoked {revoked} credential(s).", messages.SUCCESS)

    def issue_form_class(self):
        owner_qs = self.owner_model.objects.all()
        if self.owner_model is JobAgent:
            owner_qs = owner_qs.select_related("workspace")

        class IssueForm(forms.Form):
            name = forms.CharField(max_length=200, initial="default")

        owner = forms.ModelChoiceField(queryset=owner_qs)
        if self.owner_model is JobAgent:  # agent names repeat across workspaces
            owner.label_from_instance = lambda agent: f"{agent.workspace} / {agent.name}"
        IssueForm.base_fields = {self.owner_field: owner, **IssueForm.base_fields}
        return IssueForm

    def add_view(self, request, form_url="", extra_context=None):
        if not self.has_add_permission(request):
            raise PermissionDenied
        form_class = self.issue_form_class()
        if request.method == "POST":
            form = form_class(request.POST)
            if form.is_valid():
                owner = form.cleaned_data[self.owner_field]
                row, raw = type(self).issue(owner, form.cleaned_data["name"])
                self.log_addition(request, row, f"Issued by {operator_actor(request)}.")
                context = {
                    **self.admin_site.each_context(request),
                    "title": f"{self.opts.verbose_name.capitalize()} issued",
                    "opts": self.opts,
                    "row": row,
                    "owner": owner,
                    "secret": raw,
                    "changelist_url": reverse(
                        f"admin:{self.opts.app_label}_{self.opts.model_name}_changelist"
                    ),
                }
                response = TemplateResponse(
                    request, "admin/agents/credential_issued.html", context
                )
                response["Cache-Control"] = "no-store"
                return response
        else:
            form = form_class(initial={self.owner_field: request.GET.get(self.owner_field)})
        context = {
            **self.admin_site.each_context(request),
            "title": f"Issue a {self.opts.verbose_name}",
            "opts": self.opts,
            "form": form,
            "changelist_url": reverse(
                f"admin:{self.opts.app_label}_{self.opts.model_name}_changelist"
            ),
        }
        return TemplateResponse(request, "admin/agents/credential_issue.html", context)


@admin.register(AgentToken)
class AgentTokenAdmin(CredentialAdmin):
    owner_field = "job_agent"
    owner_model = JobAgent
    kind = credentials.AGENT_TOKEN_KIND
    issue = staticmethod(credentials.create_agent_token)
    revoke = staticmethod(credentials.revoke_agent_token)
    list_display = ["name", "masked", "job_agent", "workspace", "active", "created_at",
                    "last_used_at", "expires_at", "revoked_at"]
    list_filter = [RevokedFilter, "job_agent__workspace", "job_agent"]
    list_select_related = ["job_agent__workspace"]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(expired=credentials.expired())

    @admin.display(description="active", boolean=True)
    def active(self, obj):
        # Neither revoked nor past its expires_at (the database's clock).
        return obj.revoked_at is None and not getattr(obj, "expired", False)

    def get_readonly_fields(self, request, obj=None):
        return [*super().get_readonly_fields(request, obj), "last_used_at", "expires_at",
                "replaced_by"]

    def get_fields(self, request, obj=None):
        fields = super().get_fields(request, obj)
        # before revoked_at
        return [*fields[:-1], "last_used_at", "expires_at", "replaced_by", fields[-1]]

    @admin.display(description="workspace")
    def workspace(self, obj):
        return obj.job_agent.workspace


@admin.register(WorkspaceApiKey)
class WorkspaceApiKeyAdmin(CredentialAdmin):
    owner_field = "workspace"
    owner_model = Workspace
    kind = credentials.API_KEY_KIND
    issue = staticmethod(credentials.create_workspace_api_key)
    revoke = staticmethod(credentials.revoke_workspace_api_key)
    list_display = ["name", "masked", "workspace", "active", "created_at", "revoked_at"]
    list_filter = [RevokedFilter, "workspace"]
    list_select_related = ["workspace"]


# --- job agents ------------------------------------------------------------------------------


class AgentTokenInline(admin.TabularInline):
    """The agent's credentials, read-only: issue and revoke from the agent token admin."""

    model = AgentToken
    fields = ["name", "masked_prefix", "created_at", "last_used_at", "expires_at", "revoked_at"]
    readonly_fields = fields
    extra = 0
    max_num = 0
    can_delete = False
    show_change_link = True
    verbose_name = "credential"
    verbose_name_plural = "credentials (issue and revoke under Agent tokens)"

    @admin.display(description="token")
    def masked_prefix(self, obj):
        return masked(credentials.AGENT_TOKEN_KIND, obj)

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


def _lease_bounds_validator(field):
    check = {
        "lease_seconds": lifecycle.validate_lease_seconds,
        "max_attempts": lifecycle.validate_max_attempts,
        "max_runtime_seconds": lifecycle.validate_max_runtime_seconds,
    }[field]

    def clean(self):
        value = self.cleaned_data.get(field)
        try:
            return check(value)
        except InvalidInput as exc:
            raise ValidationError(exc.detail if hasattr(exc, "detail") else str(exc)) from exc

    return clean


class LabelsField(forms.CharField):
    """An agent's labels in the admin: space- or comma-separated, checked by the lifecycle's
    rule (docs/api.md, "Labels and routing"); saved as the API saves them (a sorted set)."""

    def prepare_value(self, value):
        if isinstance(value, list | tuple):
            return " ".join(value)
        return value

    def to_python(self, value):
        text = super().to_python(value) or ""
        try:
            return inputs.labels([p for p in text.replace(",", " ").split() if p])
        except InvalidInput as exc:
            raise ValidationError(exc.detail) from exc


class JobAgentForm(forms.ModelForm):
    labels = LabelsField(
        required=False, max_length=32 * 64,
        help_text="Space- or comma-separated, at most 32, each 1 to 63 characters of "
                  "A-Z a-z 0-9 . _ : = / -. Claims made from now on match labelled jobs by "
                  "them.")

    class Meta:
        model = JobAgent
        fields = ["workspace", "name", "lease_seconds", "max_attempts", "max_runtime_seconds",
                  "labels"]


@admin.register(JobAgent)
class JobAgentAdmin(OfferedFiltersOnly):
    form = JobAgentForm
    list_display = [
        "name",
        "workspace",
        "id",
        "claims_state",
        "labels_display",
        "online",
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
    actions = ["pause_agents", "resume_agents"]
    readonly_fields = [
        "id",
        "type",
        "created_at",
        "claims_state",
        "labels_display",
        "online",
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
            "max_runtime_seconds",
            "labels",
            "created_at",
            "claims_state",
            "online",
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
        form.clean_max_runtime_seconds = _lease_bounds_validator("max_runtime_seconds")
        return form

    def save_model(self, request, obj, form, change):
        """A change writes the fields the form changed, and nothing else: a full-row save
        would write back the paused_at and last_seen_at this request read, undoing a pause
        (or resume) that committed in between, without its slot and permit bookkeeping."""
        if not change:
            return super().save_model(request, obj, form, change)
        changed = [name for name in form.changed_data if name in form._meta.fields]
        if changed:
            obj.save(update_fields=changed)
        return None

    def get_queryset(self, request):
        # The same health numbers as the API's job-agent detail (agents.health).
        return with_health(super().get_queryset(request)).annotate(db_now=Now())

    def get_search_results(self, request, queryset, search_term):
        return name_or_id_search(queryset, search_term)

    @admin.display(description="workspace")
    def workspace_display(self, obj):
        return obj.workspace

    @admin.display(description="claims", ordering="paused_at")
    def claims_state(self, obj):
        if obj.pk is None or obj.paused_at is None:
            return "running"
        since = describe_age(obj.paused_at, row_db_now(obj))
        reason = f": {obj.paused_reason}" if obj.paused_reason else ""
        return f"PAUSED since {since} by {obj.paused_by}{reason}"

    @admin.action(description="Pause claims of the selected job agents (jobs in flight go on)",
                  permissions=["change"])
    def pause_agents(self, request, queryset):
        self._pause_or_resume(request, queryset, lifecycle.pause_job_agent, "paused")

    @admin.action(description="Resume claims of the selected job agents", permissions=["change"])
    def resume_agents(self, request, queryset):
        self._pause_or_resume(request, queryset, lifecycle.resume_job_agent, "resumed")

    def _pause_or_resume(self, request, queryset, transition, done):
        actor = operator_actor(request)
        agents = list(queryset)
        changed = 0
        for agent in agents:
            if transition(agent, actor)[1]:
                changed += 1
                self.log_change(request, agent, f"Claims {done} by {actor}.")
        unchanged = len(agents) - changed
        note = f" ({unchanged} already {done})" if unchanged else ""
        self.message_user(request, f"{changed} job agent(s) {done}{note}.", messages.SUCCESS)

    @admin.display(description="labels")
    def labels_display(self, obj):
        return ", ".join(obj.labels or []) or "-"

    @admin.display(description="online", boolean=True, ordering="online")
    def online(self, obj):
        # Seen within JOBQUEUE_AGENT_ONLINE_SECONDS, by the database's clock (agents.health).
        return bool(getattr(obj, "online", False))

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


# --- registration tokens -----------------------------------------------------------------


@admin.register(RegistrationToken)
class RegistrationTokenAdmin(HashedSecretAdmin):
    """Registration tokens (issued with the API's `POST registration-tokens`, shown once):
    listed with their uses and expiry, revoked with the action. Never their secret."""

    list_display = ["description_display", "masked", "workspace", "labels_display",
                    "uses_display", "expires_at", "usable", "created_at", "revoked_at"]
    list_filter = [RevokedFilter, "workspace"]
    list_select_related = ["workspace"]
    search_fields = ["description", "prefix"]
    actions = ["revoke_selected"]
    fields = ["workspace", "description", "masked", "labels_display", "uses_display",
              "token_ttl_seconds", "expires_at", "created_at", "revoked_at"]
    readonly_fields = fields

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(db_now=Now())

    def has_add_permission(self, request):
        return False  # issued over the API, where its secret is shown once

    def has_change_permission(self, request, obj=None):
        return obj is None and super().has_change_permission(request)

    def has_delete_permission(self, request, obj=None):
        return False  # revoke instead: the row stays as the record of what it registered

    @admin.display(description="description")
    def description_display(self, obj):
        return obj.description or "(none)"

    @admin.display(description="token")
    def masked(self, obj):
        return masked(registration.KIND, obj)

    @admin.display(description="labels")
    def labels_display(self, obj):
        return ", ".join(obj.labels or []) or "any"

    @admin.display(description="uses")
    def uses_display(self, obj):
        return f"{obj.uses} of {obj.max_uses}"

    @admin.display(description="usable", boolean=True)
    def usable(self, obj):
        # Not revoked, not expired (the database's clock), not used up.
        return (obj.revoked_at is None and obj.uses < obj.max_uses
                and obj.expires_at > row_db_now(obj))

    @admin.action(description="Revoke selected registration tokens", permissions=["change"])
    def revoke_selected(self, request, queryset):
        revoked = 0
        for row in queryset.filter(revoked_at__isnull=True):
            registration.revoke(row)
            self.log_change(request, row, f"Revoked by {operator_actor(request)}.")
            revoked += 1
        self.message_user(request, f"Revoked {revoked} registration token(s).",
                          messages.SUCCESS)
