"""Registration tokens and self-registration (docs/api.md, "Registering an agent").

A registration token (`jqr_<prefix>_<secret>`, shown once, stored as the SHA-256 of the whole
string like the credentials) lets an agent create itself: `POST /v1/register {registration_
token, name, labels?}` makes a job agent of the token's workspace and an agent token for it.

Counting is race-safe: the registration's first write is a conditional UPDATE of the token's
row (`uses = uses + 1` only while `uses < max_uses`, unrevoked and unexpired, on the database's
clock), so of N racing registrations with `max_uses` k exactly k pass it (PostgreSQL: each waits
for the row, then re-checks). Everything is one transaction: a registration refused after that
(the name taken) rolls its use back, so a refused registration uses nothing.
"""

from __future__ import annotations

from django.db import transaction
from django.db.models import F, Q
from django.db.models.functions import Now

from jobqueue import exceptions as domain
from jobqueue.db import NowPlusSeconds
from jobqueue.lifecycle import create_job_agent, inputs
from jobqueue.models import JobAgent, Workspace

from . import credentials
from .models import AgentToken, RegistrationToken

KIND = "jqr"
DEFAULT_EXPIRES_IN_SECONDS = 3600


class RegistrationTokenInvalid(Exception):
    """Unknown, revoked, expired or used up: one answer for all (401)."""


class LabelsNotAllowed(domain.JobQueueError):
    code = "labels_not_allowed"
    default_detail = "The labels asked for are not a subset of the registration token's."


def issue(workspace_id, *, description: str = "", labels=(), max_uses: int = 1,
          expires_in_seconds: int = DEFAULT_EXPIRES_IN_SECONDS,
          token_ttl_seconds: int | None = None) -> tuple[RegistrationToken, str]:
    """A new registration token of the workspace, and its secret (shown once)."""
    prefix, raw = credentials.new_secret(KIND)
    row = RegistrationToken.objects.create(
        workspace_id=workspace_id, description=description, prefix=prefix,
        secret_hash=credentials.hash_secret(raw), labels=inputs.labels(list(labels)),
        max_uses=max_uses, expires_at=NowPlusSeconds(expires_in_seconds),
        token_ttl_seconds=token_ttl_seconds,
    )
    row.refresh_from_db(fields=["expires_at", "created_at"])
    return row, raw


def revoke(row: RegistrationToken) -> RegistrationToken:
    RegistrationToken.objects.filter(id=row.id, revoked_at__isnull=True).update(revoked_at=Now())
    row.refresh_from_db()
    return row


def _usable() -> Q:
    return Q(revoked_at__isnull=True, expires_at__gt=Now(), uses__lt=F("max_uses"))


def register(raw, name: str, labels=None) -> tuple[JobAgent, AgentToken, str]:
    """Create a job agent named `name` in the registration token's workspace, with `labels`
    (a subset of the token's; the token's when None), and an agent token for it (living the
    registration token's token_ttl_seconds). Returns (agent, token row, token secret).

    RegistrationTokenInvalid: unknown, revoked, expired or used up. LabelsNotAllowed (403),
    domain.AgentNameTaken (409), InvalidInput (400: a malformed name or label). A refused
    registration uses nothing."""
    name = inputs.agent_name(name)
    asked = None if labels is None else inputs.labels(labels)
    row = credentials.find_secret(RegistrationToken.objects.all(), KIND, raw)
    if row is None:
        raise RegistrationTokenInvalid()
    with transaction.atomic():
        # The count first: the row's lock (PostgreSQL) orders racing registrations, and an
        # unusable token is the one 401 whatever else is asked. What refuses after it rolls
        # the use back.
        if not RegistrationToken.objects.filter(_usable(), id=row.id).update(
                uses=F("uses") + 1):
            raise RegistrationTokenInvalid()
        if asked is None:
            granted = list(row.labels)
        elif not row.labels or set(asked) <= set(row.labels):
            granted = asked
        else:
            raise LabelsNotAllowed()
        agent = create_job_agent(workspace=Workspace.objects.get(id=row.workspace_id),
                                 name=name, labels=granted, name_taken=domain.AgentNameTaken)
        token, secret = credentials.create_agent_token(agent, name="registered",
                                                       ttl_seconds=row.token_ttl_seconds)
    return agent, token, secret
