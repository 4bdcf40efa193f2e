"""Credentials. Shown once, stored as a SHA-256 of the whole secret with a lookup prefix.

Secrets are 256-bit random values, so a fast hash is enough (there is nothing to brute-force);
comparison is constant-time. Revocation takes effect on the next request: every request
looks its credential up.
"""

import uuid

from django.db import models
from django.db.models.functions import Now

from jobqueue.models import JobAgent, Workspace


class CredentialQuerySet(models.QuerySet):
    def active(self):
        return self.filter(revoked_at__isnull=True)


class Credential(models.Model):
    """What both kinds of credential hold: a name, the lookup prefix, the hash of the whole
    secret, and when it was made and revoked."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=200, default="default")
    prefix = models.CharField(max_length=16, unique=True, editable=False)
    secret_hash = models.CharField(max_length=64, editable=False)
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = CredentialQuerySet.as_manager()

    class Meta:
        abstract = True
        ordering = ["-created_at"]

    def __str__(self):
        return f"{self.name} ({self.prefix}…)"


class WorkspaceApiKey(Credential):
    """Sent as `X-API-Key`; acts for its whole workspace (producer and operator)."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="api_keys")

    class Meta(Credential.Meta):
        db_table = "workspace_api_key"
        verbose_name = "workspace API key"


class AgentToken(Credential):
    """Sent as `Authorization: Bearer …`; acts only as its job agent, on its own jobs."""

    job_agent = models.ForeignKey(JobAgent, on_delete=models.CASCADE, related_name="tokens")
    # Presence: the last request made with this token, by the database's clock; written at
    # most once per JOBQUEUE["AGENT_SEEN_WRITE_SECONDS"] (60) per token, never per request
    # (agents/health.py).
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    # Expiry and rotation (agents/credentials.py, docs/api.md "Token expiry and rotation"):
    # when it stops working (None: never), by the database's clock; the lifetime a rotation
    # gives its successor (None: no expiry); the token its latest rotation issued.
    expires_at = models.DateTimeField(null=True, blank=True, editable=False)
    ttl_seconds = models.PositiveIntegerField(null=True, blank=True, editable=False)
    replaced_by = models.OneToOneField(
        "self", null=True, blank=True, editable=False, on_delete=models.SET_NULL,
        related_name="replaces",
    )

    class Meta(Credential.Meta):
        db_table = "agent_token"


class RegistrationToken(models.Model):
    """Lets agents register themselves (`POST /v1/register`): each registration creates a job
    agent of its workspace with a token of its own. Shown once, stored hashed like the
    credentials (kind `jqr`); it is not a credential of the workspace: it reaches only
    `/v1/register`. Counted: at most `max_uses` registrations, until `expires_at`, unless
    revoked (agents/registration.py)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE,
                                  related_name="registration_tokens")
    description = models.CharField(max_length=500, blank=True, default="")
    prefix = models.CharField(max_length=16, unique=True, editable=False)
    secret_hash = models.CharField(max_length=64, editable=False)
    # The labels an agent it registers may have (its requested ones, a subset of these; or
    # these when it asks none). Empty: any labels.
    labels = models.JSONField(default=list, blank=True)
    max_uses = models.PositiveIntegerField(default=1)
    uses = models.PositiveIntegerField(default=0, editable=False)
    expires_at = models.DateTimeField()
    # The lifetime of the agent tokens it issues (None: they never expire).
    token_ttl_seconds = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "registration_token"
        ordering = ["-created_at"]

    def __str__(self):
        return f"{self.description or 'registration token'} ({self.prefix}…)"
