"""An agent's tokens: issue one (workspace key; the secret is answered once, with its expiry),
list them (never a secret), revoke one; and the agent's own rotation of the token it presents
(docs/api.md, "Token expiry and rotation")."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.exceptions import AuthenticationFailed, NotFound, PermissionDenied
from rest_framework.response import Response

from .. import credentials
from ..exceptions import TokenExpired
from ..pagination import NewestFirst
from ..schema import COMMON, WITH_BODY, errors
from ..serializers.tokens import (
    TokenCreateInput,
    TokenListItemSerializer,
    TokenPage,
    TokenRotatedSerializer,
    TokenRotateInput,
    TokenSerializer,
)
from .base import AGENT, AGENT_TAGS, PAGE_PARAMS, PRODUCER_TAGS, ApiViewSet


class TokenViewSet(ApiViewSet):
    # workspaces/{workspace_id}/job-agents/{agent_id}/tokens[/{token_id}]. The list shows
    # presence (last_used_at) and never a secret: a token is shown once, when issued.
    lookup_url_kwarg = "token_id"
    route_names = {"list": "Tokens", "detail": "Token Detail"}

    @extend_schema(
        tags=PRODUCER_TAGS,
        operation_id="list_agent_tokens",
        summary="List an agent's tokens, newest first (never their secrets)",
        parameters=PAGE_PARAMS,
        responses={200: TokenPage, **errors(400, *COMMON)},
    )
    def list(self, request, workspace_id, agent_id):
        agent = self.agent_in_path()
        return self.paginated(NewestFirst, agent.tokens.all(), TokenListItemSerializer)

    @extend_schema(
        tags=PRODUCER_TAGS,
        operation_id="issue_agent_token",
        summary="Issue an agent token (the secret is returned once)",
        request=TokenCreateInput,
        responses={201: TokenSerializer, **errors(*WITH_BODY, *COMMON)},
    )
    def create(self, request, workspace_id, agent_id):
        data = self.validated(TokenCreateInput)
        agent = self.agent_in_path()
        token, raw = credentials.create_agent_token(agent, name=data["name"],
                                                    ttl_seconds=data.get("ttl_seconds"))
        token.refresh_from_db(fields=["created_at"])
        body = {"id": token.id, "name": token.name, "token": raw,
                "token_expires_at": token.expires_at, "created_at": token.created_at}
        return Response(TokenSerializer(body).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        tags=AGENT_TAGS,
        operation_id="rotate_agent_token",
        summary="Rotate the presenting agent token: a new one, the old one ends after the overlap",
        request=TokenRotateInput,
        responses={201: TokenRotatedSerializer,
                   **errors(409, *WITH_BODY, *COMMON)},
    )
    @action(detail=False, methods=["post"], url_path="rotate", url_name="rotate",
            name="Rotate", permission_classes=AGENT)
    def rotate(self, request, workspace_id, agent_id):
        # The agent's own token only: the workspace key has no token to rotate (403, once
        # the agent in the path is one of its workspace's: 404 otherwise, as everywhere).
        self.agent_in_path()
        data = self.validated(TokenRotateInput)  # (a bad body is a 400 for every caller)
        if not self.principal.is_agent:
            raise PermissionDenied("Rotate with the agent's own token (Authorization: Bearer).")
        try:
            token, raw, previous_ends = credentials.rotate_agent_token(
                self.principal.credential_id, data["overlap_seconds"])
        except credentials.TokenNotCurrent as exc:  # pragma: no cover -- a race: revoked or
            # expired between this request's authentication and its rotation's lock (the
            # refusal itself: test_a_token_revoked_or_expired_after_its_authentication_...)
            if exc.expired:
                raise TokenExpired() from exc
            raise AuthenticationFailed("Invalid or revoked agent token.") from exc
        token.refresh_from_db(fields=["created_at"])
        body = {"id": token.id, "name": token.name, "token": raw,
                "token_expires_at": token.expires_at,
                "previous_token_expires_at": previous_ends, "created_at": token.created_at}
        return Response(TokenRotatedSerializer(body).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        tags=PRODUCER_TAGS,
        operation_id="revoke_agent_token",
        summary="Revoke an agent token (immediate; idempotent)",
        responses={204: OpenApiResponse(description="Revoked."), **errors(*COMMON)},
    )
    def destroy(self, request, workspace_id, agent_id, token_id):
        agent = self.agent_in_path()
        token = agent.tokens.filter(id=self.path_uuid("token_id")).first()
        if token is None:
            raise NotFound("No such token.")
        credentials.revoke_agent_token(token)
        return Response(status=status.HTTP_204_NO_CONTENT)
