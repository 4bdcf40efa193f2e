"""Issue, resolve and revoke credentials. The raw secret is returned once and never stored.

Format: `<kind>_<prefix>_<secret>`, kind `jqk` (workspace API key) or `jqa` (agent token);
the prefix finds the row, the SHA-256 of the whole string is compared in constant time.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import re
import secrets

from django.db import transaction
from django.db.models import BooleanField, ExpressionWrapper, Q
from django.db.models.functions import Now

from jobqueue.db import NowPlusSeconds
from jobqueue.exceptions import Conflict

from .models import AgentToken, WorkspaceApiKey

API_KEY_KIND = "jqk"
_PREFIX = re.compile(r"[0-9a-f]{12}")
AGENT_TOKEN_KIND = "jqa"


def _hash(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def _new_secret(kind: str) -> tuple[str, str]:
    prefix = secrets.token_hex(6)  # 12 hex chars
    raw = f"{kind}_{prefix}_{secrets.token_urlsafe(32)}"
    return prefix, raw


def _split(raw: str, kind: str) -> str | None:
    if not isinstance(raw, str) or len(raw) > 200:
        return None
    parts = raw.split("_", 2)
    if len(parts) != 3 or parts[0] != kind or not _PREFIX.fullmatch(parts[1]):
        return None
    return parts[1]


def create_workspace_api_key(workspace, name: str = "default") -> tuple[WorkspaceApiKey, str]:
    prefix, raw = _new_secret(API_KEY_KIND)
    key = WorkspaceApiKey.objects.create(
        workspace=workspace, name=name, prefix=prefix, secret_hash=_hash(raw)
    )
    return key, raw


def create_agent_token(job_agent, name: str = "default",
                       ttl_seconds: int | None = None) -> tuple[AgentToken, str]:
    """A new token of the agent, and its secret (shown once). With `ttl_seconds`, it expires
    that long after now (the database's clock), and so will each token rotated from it."""
    prefix, raw = _new_secret(AGENT_TOKEN_KIND)
    token = AgentToken.objects.create(
        job_agent=job_agent, name=name, prefix=prefix, secret_hash=_hash(raw),
        ttl_seconds=ttl_seconds,
        expires_at=None if ttl_seconds is None else NowPlusSeconds(ttl_seconds),
    )
    if ttl_seconds is not None:
        token.refresh_from_db(fields=["expires_at"])
    return token, raw


# Shared with registration tokens (agents/registration.py), which are made and checked alike.
new_secret = _new_secret
hash_secret = _hash


def issue_workspace_api_key(workspace, name: str = "default") -> str:
    """Used by `create_workspace`: returns the raw key (shown once)."""
    return create_workspace_api_key(workspace, name)[1]


def issue_agent_token(job_agent, name: str = "default") -> str:
    """Used by `create_job_agent`: returns the raw token (shown once)."""
    return create_agent_token(job_agent, name)[1]


def find_secret(queryset, kind: str, raw: str):
    """The row of `queryset` whose secret `raw` is (a `kind` string: its prefix finds the row,
    the SHA-256 of the whole string is compared in constant time), or None. Every secret the
    service issues (workspace keys, agent tokens, registration tokens) is checked here."""
    prefix = _split(raw, kind)
    if prefix is None:
        return None
    row = queryset.filter(prefix=prefix).first()
    if row is None or not hmac.compare_digest(row.secret_hash, _hash(raw)):
        return None
    return row


def _resolve(model, kind: str, raw: str, related: str, **annotations):
    return find_secret(
        model.objects.active().select_related(*related.split(",")).annotate(**annotations),
        kind, raw)


def resolve_api_key(raw: str) -> WorkspaceApiKey | None:
    """The active key for this raw string, with its workspace, or None."""
    return _resolve(WorkspaceApiKey, API_KEY_KIND, raw, "workspace")


def expired():
    """A boolean the database computes with a token's row: past its expires_at."""
    return ExpressionWrapper(Q(expires_at__isnull=False) & Q(expires_at__lte=Now()),
                             output_field=BooleanField())


def resolve_agent_token(raw: str, **annotations) -> AgentToken | None:
    """The unrevoked token for this raw string, with its agent and workspace, or None;
    `expired` says whether it has expired, and `annotations` are computed with its row too
    (the authentication's presence_due)."""
    return _resolve(AgentToken, AGENT_TOKEN_KIND, raw, "job_agent__workspace",
                    expired=expired(), **annotations)


class TokenAlreadyRotated(Conflict):
    code = "token_already_rotated"
    default_detail = ("This token was rotated and its successor has been used: use the "
                      "successor.")


class TokenNotCurrent(Exception):
    """The presenting token was revoked or expired between its request's authentication and
    its rotation (the view answers it as that authentication would have)."""

    def __init__(self, expired: bool):
        super().__init__("expired" if expired else "revoked")
        self.expired = expired


def rotate_agent_token(token_id, overlap_seconds: int):
    """Rotate the agent token `token_id` (the one the request presented): a new token of the
    same agent, name and lifetime policy (`ttl_seconds`: it expires that long after now, or
    never), and the presenting token expires `overlap_seconds` after now (or earlier, if it
    expired earlier already). Returns (the new token, its secret, the presenting token's
    expires_at).

    Rotating again with a token already rotated (the first answer was lost): while its
    successor has never been used, the successor is revoked and another one issued (the
    presenting token's expiry stays as the first rotation set it); once the successor has
    been used, TokenAlreadyRotated (409). Both rows are locked (the presenting one first), so
    racing rotations of one token issue one successor at a time."""
    with transaction.atomic():
        current = (AgentToken.objects.select_for_update()
                   .annotate(expired=expired(), db_now=Now()).filter(id=token_id).first())
        if current is None or current.revoked_at is not None or current.expired:
            raise TokenNotCurrent(expired=bool(current is not None and current.expired))
        if current.replaced_by_id is not None:
            previous = AgentToken.objects.select_for_update().get(id=current.replaced_by_id)
            # Used: a request made with it (its presence), or rotated in turn (its holder had
            # it; revoking it would leave its own successor live beside the new one).
            if previous.last_used_at is not None or previous.replaced_by_id is not None:
                raise TokenAlreadyRotated()
            AgentToken.objects.filter(id=previous.id, revoked_at__isnull=True).update(
                revoked_at=Now())
            ends = current.expires_at
        else:  # the overlap, from the database's now, never past an earlier expiry
            ends = current.db_now + dt.timedelta(seconds=overlap_seconds)
            if current.expires_at is not None:
                ends = min(current.expires_at, ends)
        new, raw = create_agent_token(current.job_agent, name=current.name,
                                      ttl_seconds=current.ttl_seconds)
        AgentToken.objects.filter(id=current.id).update(replaced_by=new, expires_at=ends)
    return new, raw, ends


def revoke_agent_token(token: AgentToken) -> AgentToken:
    AgentToken.objects.filter(id=token.id, revoked_at__isnull=True).update(revoked_at=Now())
    token.refresh_from_db()
    return token


def revoke_workspace_api_key(key: WorkspaceApiKey) -> WorkspaceApiKey:
    WorkspaceApiKey.objects.filter(id=key.id, revoked_at__isnull=True).update(revoked_at=Now())
    key.refresh_from_db()
    return key
