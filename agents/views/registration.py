"""Registration (docs/api.md, "Registering an agent").

Registration tokens are the workspace key's (`registration-tokens`: issue, list, revoke);
`POST /v1/register` takes no credential but the registration token in its body, which reaches
nothing else (it is no workspace credential: with it, every other endpoint answers 401)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.exceptions import NotFound
from rest_framework.response import Response
from rest_framework.views import APIView

from jobqueue.conf import jobqueue_settings
from jobqueue.lifecycle.claim import heartbeat_interval_for

from .. import registration
from ..exceptions import LabelsNotAllowed, RegistrationTokenInvalid
from ..pagination import NewestFirst
from ..parsers import StrictJSONParser
from ..schema import COMMON, WITH_BODY, errors
from ..serializers.registration import (
    RegisteredSerializer,
    RegisterInput,
    RegistrationTokenCreateInput,
    RegistrationTokenIssuedSerializer,
    RegistrationTokenPage,
    RegistrationTokenSerializer,
)
from ..serializers.shared_instances import validate_input
from ..throttling import RegistrationRateThrottle
from .base import PAGE_PARAMS, PRODUCER_TAGS, ApiViewSet


class RegistrationTokenViewSet(ApiViewSet):
    # workspaces/{workspace_id}/registration-tokens[/{token_id}]: the workspace key only.
    lookup_url_kwarg = "token_id"
    route_names = {"list": "Registration Tokens", "detail": "Registration Token Detail"}

    @extend_schema(
        tags=PRODUCER_TAGS,
        operation_id="issue_registration_token",
        summary="Issue a registration token (the secret is returned once)",
        request=RegistrationTokenCreateInput,
        responses={201: RegistrationTokenIssuedSerializer, **errors(*WITH_BODY, *COMMON)},
    )
    def create(self, request, workspace_id):
        data = self.validated(RegistrationTokenCreateInput)
        row, raw = registration.issue(
            self.principal.workspace_id, description=data["description"],
            labels=data["labels"], max_uses=data["max_uses"],
            expires_in_seconds=data["expires_in_seconds"],
            token_ttl_seconds=data.get("token_ttl_seconds"))
        body = {**RegistrationTokenSerializer(row).data, "token": raw}
        return Response(RegistrationTokenIssuedSerializer(body).data,
                        status=status.HTTP_201_CREATED)

    @extend_schema(
        tags=PRODUCER_TAGS,
        operation_id="list_registration_tokens",
        summary="List registration tokens, newest first (never their secrets)",
        parameters=PAGE_PARAMS,
        responses={200: RegistrationTokenPage, **errors(400, *COMMON)},
    )
    def list(self, request, workspace_id):
        rows = registration.RegistrationToken.objects.filter(
            workspace_id=self.principal.workspace_id)
        return self.paginated(NewestFirst, rows, RegistrationTokenSerializer)

    @extend_schema(
        tags=PRODUCER_TAGS,
        operation_id="revoke_registration_token",
        summary="Revoke a registration token (immediate; idempotent)",
        responses={204: OpenApiResponse(description="Revoked."), **errors(*COMMON)},
    )
    def destroy(self, request, workspace_id, token_id):
        row = registration.RegistrationToken.objects.filter(
            id=self.path_uuid("token_id"), workspace_id=self.principal.workspace_id).first()
        if row is None:
            raise NotFound("No such registration token.")
        registration.revoke(row)
        return Response(status=status.HTTP_204_NO_CONTENT)


class RegisterView(APIView):
    # POST /v1/register: the registration token in the body is the only credential; any
    # other one sent is not looked at. Throttled per client address.
    authentication_classes: list = []
    permission_classes: list = []
    throttle_classes = [RegistrationRateThrottle]
    parser_classes = [StrictJSONParser]

    def get_authenticate_header(self, request):
        # A refused registration token is a 401, which carries a challenge.
        return 'RegistrationToken realm="jobqueue"'

    @extend_schema(
        tags=["agent"],
        operation_id="register_agent",
        summary="Register a job agent with a registration token (its token is returned once)",
        auth=[],
        request=RegisterInput,
        responses={201: RegisteredSerializer, **errors(403, 409, *WITH_BODY, 401, 429)},
    )
    def post(self, request):
        data = validate_input(RegisterInput, request.data)
        try:
            agent, token, secret = registration.register(
                data["registration_token"], data["name"], data.get("labels"))
        except registration.RegistrationTokenInvalid as exc:
            raise RegistrationTokenInvalid() from exc
        except registration.LabelsNotAllowed as exc:
            raise LabelsNotAllowed() from exc
        lease = agent.effective_lease_seconds
        body = {
            "workspace_id": agent.workspace_id,
            "job_agent": {"id": agent.id, "name": agent.name, "labels": agent.labels},
            "token": secret,
            "token_expires_at": token.expires_at,
            "settings": {
                "lease_seconds": lease,
                "heartbeat_interval_seconds": heartbeat_interval_for(lease),
                "max_wait_seconds": int(jobqueue_settings()["MAX_CLAIM_WAIT_SECONDS"]),
            },
        }
        return Response(RegisteredSerializer(body).data, status=status.HTTP_201_CREATED)
