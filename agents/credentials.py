"""Issue, resolve and revoke credentials. The raw secret is returned once and never stored.

Format: `<kind>_<prefix>_<secret>`, kind `jqk` (workspace API key) or `jqa` (agent token);
the prefix finds the row, the SHA-256 of the whole string is compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

from django.db.models.functions import Now

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


def create_agent_token(job_agent, name: str = "default") -> tuple[AgentToken, str]:
    prefix, raw = _new_secret(AGENT_TOKEN_KIND)
    token = AgentToken.objects.create(
        job_agent=job_agent, name=name, prefix=prefix, secret_hash=_hash(raw)
    )
    return token, raw


def issue_workspace_api_key(workspace, name: str = "default") -> str:
    """Used by `create_workspace`: returns the raw key (shown once)."""
    return create_workspace_api_key(workspace, name)[1]


def issue_agent_token(job_agent, name: str = "default") -> str:
    """Used by `create_job_agent`: returns the raw token (shown once)."""
    return create_agent_token(job_agent, name)[1]


def _resolve(model, kind: str, raw: str, related: str, **annotations):
    prefix = _split(raw, kind)
    if prefix is None:
        return None
    row = (model.objects.active().select_related(*related.split(",")).annotate(**annotations)
           .filter(prefix=prefix).first())
    if row is None or not hmac.compare_digest(row.secret_hash, _hash(raw)):
        return None
    return row


def resolve_api_key(raw: str) -> WorkspaceApiKey | None:
    """The active key for this raw string, with its workspace, or None."""
    return _resolve(WorkspaceApiKey, API_KEY_KIND, raw, "workspace")


def resolve_agent_token(raw: str, **annotations) -> AgentToken | None:
    """The active token for this raw string, with its agent and workspace, or None;
    `annotations` are computed with its row (the authentication's presence_due)."""
    return _resolve(AgentToken, AGENT_TOKEN_KIND, raw, "job_agent__workspace", **annotations)


def revoke_agent_token(token: AgentToken) -> AgentToken:
    AgentToken.objects.filter(id=token.id, revoked_at__isnull=True).update(revoked_at=Now())
    token.refresh_from_db()
    return token


def revoke_workspace_api_key(key: WorkspaceApiKey) -> WorkspaceApiKey:
    WorkspaceApiKey.objects.filter(id=key.id, revoked_at__isnull=True).update(revoked_at=Now())
    key.refresh_from_db()
    return key
