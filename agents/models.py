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


class WorkspaceApiKey(models.Model):
    """Sent as `X-API-Key`; acts for its whole workspace (producer and operator)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=200, default="default")
    prefix = models.CharField(max_length=16, unique=True, editable=False)
    secret_hash = models.CharField(max_length=64, editable=False)
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = CredentialQuerySet.as_manager()

    class Meta:
        db_table = "workspace_api_key"
        verbose_name = "workspace API key"
        ordering = ["-created_at"]

    def __str__(self):
        return f"{self.name} ({self.prefix}…)"


class AgentToken(models.Model):
    """Sent as `Authorization: Bearer …`; acts only as its job agent, on its own jobs."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    job_agent = models.ForeignKey(JobAgent, on_delete=models.CASCADE, related_name="tokens")
    name = models.CharField(max_length=200, default="default")
    prefix = models.CharField(max_length=16, unique=True, editable=False)
    secret_hash = models.CharField(max_length=64, editable=False)
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = CredentialQuerySet.as_manager()

    class Meta:
        db_table = "agent_token"
        ordering = ["-created_at"]

    def __str__(self):
        return f"{self.name} ({self.prefix}…)"
