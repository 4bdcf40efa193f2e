"""Who is calling: a workspace API key (`X-API-Key`) or an agent token (`Bearer`).

Both credentials are random secrets stored hashed (agents.credentials); DRF's plain-text
TokenAuthentication is not used. Each class implements authenticate_header(), so a request
without credentials is a 401 with `WWW-Authenticate`, not a 403.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed

from jobqueue import actors
from jobqueue.models import JobAgent

from . import credentials, health
from .exceptions import TokenExpired

KIND_API_KEY = "api_key"
KIND_AGENT_TOKEN = "agent_token"


@dataclass(frozen=True)
class Principal:
    """The authenticated caller; set as `request.user`."""

    kind: str
    workspace_id: uuid.UUID
    credential_id: uuid.UUID
    job_agent: JobAgent | None = field(default=None, compare=False)

    is_authenticated = True
    is_anonymous = False

    @property
    def is_agent(self) -> bool:
        return self.kind == KIND_AGENT_TOKEN

    @property
    def job_agent_id(self) -> uuid.UUID | None:
        return self.job_agent.id if self.job_agent is not None else None

    @property
    def actor(self) -> str:
        """Who did it, on job events (jobqueue.actors): the agent, or the workspace key."""
        if self.is_agent:
            return actors.agent_actor(self.job_agent_id)
        return actors.producer_actor(self.credential_id)

    @property
    def throttle_ident(self) -> str:
        return f"agent:{self.job_agent_id}" if self.is_agent else f"key:{self.credential_id}"


class AgentTokenAuthentication(BaseAuthentication):
    """`Authorization: Bearer jqa_...`: acts only as its job agent."""

    keyword = b"bearer"

    def authenticate(self, request):
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() != self.keyword:
            return None
        if len(parts) != 2:
            raise AuthenticationFailed("Malformed Authorization header: use 'Bearer <token>'.")
        try:
            raw = parts[1].decode("ascii")
        except UnicodeDecodeError as exc:
            raise AuthenticationFailed("Invalid or revoked agent token.") from exc
        token = credentials.resolve_agent_token(raw, presence_due=health.presence_due())
        if token is None:
            raise AuthenticationFailed("Invalid or revoked agent token.")
        if token.expired:
            raise TokenExpired()
        agent = token.job_agent
        if token.presence_due:
            health.note_token_used(token.id, agent.id)
        principal = Principal(
            kind=KIND_AGENT_TOKEN,
            workspace_id=agent.workspace_id,
            credential_id=token.id,
            job_agent=agent,
        )
        return principal, token

    def authenticate_header(self, request):
        return 'Bearer realm="jobqueue"'


class ApiKeyAuthentication(BaseAuthentication):
    """`X-API-Key: jqk_...`: acts for its whole workspace."""

    def authenticate(self, request):
        raw = request.META.get("HTTP_X_API_KEY")
        if raw is None:
            return None
        key = credentials.resolve_api_key(raw.strip())
        if key is None:
            raise AuthenticationFailed("Invalid or revoked API key.")
        principal = Principal(
            kind=KIND_API_KEY, workspace_id=key.workspace_id, credential_id=key.id
        )
        return principal, key

    def authenticate_header(self, request):
        return 'ApiKey header="X-API-Key"'


# OpenAPI descriptions of the two schemes (imported for its registration side effect).
from . import schema as _schema  # noqa: E402, F401
