"""An agent's tokens (workspace key): issue one (the secret is answered once), list them
(never a secret: name, prefix, when made, last used and revoked), revoke one."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.exceptions import NotFound
from rest_framework.response import Response

from .. import credentials
from ..pagination import NewestFirst
from ..schema import COMMON, WITH_BODY, errors
from ..serializers.tokens import (
    TokenCreateInput,
    TokenListItemSerializer,
    TokenPage,
    TokenSerializer,
)
from .base import PAGE_PARAMS, PRODUCER_TAGS, ApiViewSet


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
        token, raw = credentials.create_agent_token(agent, name=data["name"])
        token.refresh_from_db(fields=["created_at"])
        body = {"id": token.id, "name": token.name, "token": raw, "created_at": token.created_at}
        return Response(TokenSerializer(body).data, status=status.HTTP_201_CREATED)

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
