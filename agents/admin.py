"""Credentials in the admin: issue (the secret is shown once, on the page that issues it) and
revoke. Only the SHA-256 and a lookup prefix are stored; nothing here can show a secret again.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.template.response import TemplateResponse
from django.urls import reverse

from jobqueue.models import JobAgent, Workspace

from . import credentials
from .models import AgentToken, WorkspaceApiKey


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


class CredentialAdmin(admin.ModelAdmin):
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

    def lookup_allowed(self, lookup, value, request=None):
        # The stored hash is never filterable from the query string.
        if lookup.split("__", 1)[0] == "secret_hash":
            return False
        return super().lookup_allowed(lookup, value, request)

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
        return f"{self.kind}_{obj.prefix}_…"

    @admin.display(description="active", boolean=True)
    def active(self, obj):
        return obj.revoked_at is None

    @admin.action(description="Revoke selected credentials", permissions=["change"])
    def revoke_selected(self, request, queryset):
        revoked = 0
        for row in queryset.filter(revoked_at__isnull=True):
            type(self).revoke(row)
            self.log_change(request, row, f"Revoked by operator:{request.user.get_username()}.")
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
                self.log_addition(
                    request, row, f"Issued by operator:{request.user.get_username()}."
                )
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
                    "revoked_at"]
    list_filter = [RevokedFilter, "job_agent__workspace", "job_agent"]
    list_select_related = ["job_agent__workspace"]

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
