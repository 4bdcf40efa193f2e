"""A workspace's webhook endpoints (workspace key): create one (its signing secret is answered
once), list them, delete one, and list an endpoint's recent deliveries."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound
from rest_framework.response import Response

from jobqueue.maintenance import webhooks
from jobqueue.models import WebhookEndpoint

from ..pagination import NewestFirst
from ..schema import COMMON, WITH_BODY, errors
from ..serializers.webhooks import (
    WebhookCreatedSerializer,
    WebhookCreateInput,
    WebhookDeliveryPage,
    WebhookDeliverySerializer,
    WebhookPage,
    WebhookSerializer,
)
from .base import PAGE_PARAMS, PRODUCER_TAGS, ApiViewSet


class WebhookViewSet(ApiViewSet):
    # workspaces/{workspace_id}/webhooks[/{webhook_id}[/deliveries]]
    lookup_url_kwarg = "webhook_id"
    route_names = {"list": "Webhooks", "detail": "Webhook Detail"}

    def endpoint_in_path(self) -> WebhookEndpoint:
        endpoint = WebhookEndpoint.objects.filter(
            id=self.path_uuid("webhook_id"), workspace_id=self.principal.workspace_id).first()
        if endpoint is None:
            raise NotFound("No such webhook.")
        return endpoint

    @extend_schema(
        tags=PRODUCER_TAGS,
        operation_id="list_webhooks",
        summary="List webhook endpoints, newest first (never their secrets)",
        parameters=PAGE_PARAMS,
        responses={200: WebhookPage, **errors(400, *COMMON)},
    )
    def list(self, request, workspace_id):
        endpoints = WebhookEndpoint.objects.filter(workspace_id=self.principal.workspace_id)
        return self.paginated(NewestFirst, endpoints.defer("secret"), WebhookSerializer)

    @extend_schema(
        tags=PRODUCER_TAGS,
        operation_id="create_webhook",
        summary="Create a webhook endpoint (the signing secret is returned once); 409 "
                "webhook_limit_reached past JOBQUEUE_MAX_WEBHOOKS_PER_WORKSPACE",
        request=WebhookCreateInput,
        responses={201: WebhookCreatedSerializer, **errors(*WITH_BODY, 409, *COMMON)},
    )
    def create(self, request, workspace_id):
        data = self.validated(WebhookCreateInput)
        endpoint, secret = webhooks.create_endpoint(self.principal.workspace_id, data["url"],
                                                    data.get("events"))
        body = {"id": endpoint.id, "url": endpoint.url, "events": endpoint.events,
                "created_at": endpoint.created_at, "secret": secret}
        return Response(WebhookCreatedSerializer(body).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        tags=PRODUCER_TAGS,
        operation_id="delete_webhook",
        summary="Delete a webhook endpoint and its deliveries",
        responses={204: OpenApiResponse(description="Deleted."), **errors(*COMMON)},
    )
    def destroy(self, request, workspace_id, webhook_id):
        self.endpoint_in_path().delete()
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        tags=PRODUCER_TAGS,
        operation_id="list_webhook_deliveries",
        summary="An endpoint's deliveries, newest first",
        parameters=PAGE_PARAMS,
        responses={200: WebhookDeliveryPage, **errors(400, *COMMON)},
    )
    @action(detail=True, methods=["get"], url_path="deliveries", name="Webhook Deliveries")
    def deliveries(self, request, workspace_id, webhook_id):
        endpoint = self.endpoint_in_path()
        deliveries = endpoint.deliveries.defer("payload").select_related("group")
        return self.paginated(NewestFirst, deliveries, WebhookDeliverySerializer)
