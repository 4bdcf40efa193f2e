"""A workspace's rate limits (workspace key): set one for a `rate_limit_key`, read it, remove
it, list them. The lifecycle (jobqueue.lifecycle.ratelimits) gives out the permits a change
frees, in the change's transaction."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.exceptions import NotFound
from rest_framework.response import Response

from jobqueue.lifecycle import inputs, ratelimits
from jobqueue.models import RateLimit

from ..pagination import ByKey
from ..schema import COMMON, WITH_BODY, errors
from ..serializers.ratelimits import RateLimitInput, RateLimitPage, RateLimitSerializer
from ..serializers.shared_instances import represent
from .base import PAGE_PARAMS, PRODUCER_TAGS, ApiViewSet

# The key is text, the rest of the path (agents/urls.py: the `restofpath` converter), so
# that a key may hold "/"; the API's other ids are typed as UUIDs.
KEY_PARAM = OpenApiParameter(
    "key", OpenApiTypes.STR, OpenApiParameter.PATH,
    description="The rate_limit_key: 1 to 255 printable characters (else 400), "
    "percent-encoded (a space as %20, % as %25; a / may be sent as it is or as %2F; a key "
    "that is . or .. as %2E or %2E%2E, which clients would otherwise resolve away).",
)


class RateLimitViewSet(ApiViewSet):
    # workspaces/{workspace_id}/rate-limits[/{key}]
    lookup_url_kwarg = "key"
    lookup_value_converter = "restofpath"  # the rest of the path: a key may hold "/"
    route_names = {"list": "Rate Limits", "detail": "Rate Limit Detail"}

    def path_key(self) -> str:
        """The key from the path (decoded); one no job could carry is a 400 naming `key`."""
        return inputs.key_text(self.kwargs["key"], "key")

    @extend_schema(
        tags=PRODUCER_TAGS,
        operation_id="list_rate_limits",
        summary="List the workspace's rate limits, by key",
        parameters=PAGE_PARAMS,
        responses={200: RateLimitPage, **errors(400, *COMMON)},
    )
    def list(self, request, workspace_id):
        limits = RateLimit.objects.filter(workspace_id=self.principal.workspace_id)
        return self.paginated(ByKey, limits, RateLimitSerializer)

    @extend_schema(
        tags=PRODUCER_TAGS,
        operation_id="set_rate_limit",
        summary="Set a key's rate limit (created or replaced): its jobs are claimed only while "
                "fewer than count of them were claimed in the last period_seconds",
        parameters=[KEY_PARAM],
        request=RateLimitInput,
        responses={200: RateLimitSerializer, **errors(*WITH_BODY, *COMMON)},
    )
    def update(self, request, workspace_id, key):
        key = self.path_key()
        data = self.validated(RateLimitInput)
        count, period = inputs.rate_limit(data["count"], data["period_seconds"])
        limit = ratelimits.set_limit(self.principal.workspace_id, key, count, period)
        return Response(represent(RateLimitSerializer, limit))

    @extend_schema(
        tags=PRODUCER_TAGS,
        operation_id="get_rate_limit",
        summary="A key's rate limit; 404 when the key has none (it limits nothing)",
        parameters=[KEY_PARAM],
        responses={200: RateLimitSerializer, **errors(400, *COMMON)},
    )
    def retrieve(self, request, workspace_id, key):
        limit = ratelimits.get_limit(self.principal.workspace_id, self.path_key())
        if limit is None:
            raise NotFound("No rate limit for this key.")
        return Response(represent(RateLimitSerializer, limit))

    @extend_schema(
        tags=PRODUCER_TAGS,
        operation_id="delete_rate_limit",
        summary="Remove a key's rate limit: its held-back jobs become claimable; 404 when the "
                "key has none",
        parameters=[KEY_PARAM],
        responses={204: OpenApiResponse(description="Deleted."), **errors(400, *COMMON)},
    )
    def destroy(self, request, workspace_id, key):
        if not ratelimits.delete_limit(self.principal.workspace_id, self.path_key()):
            raise NotFound("No rate limit for this key.")
        return Response(status=status.HTTP_204_NO_CONTENT)
