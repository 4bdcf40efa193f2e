"""A workspace's fairness keys' weights (workspace key): set one for a `fairness_key`, read
it, remove it, list them. The lifecycle (jobqueue.lifecycle.fairness) respaces the key's
queued jobs by a changed weight, in the change's transaction."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.exceptions import NotFound
from rest_framework.response import Response

from jobqueue.lifecycle import fairness, inputs
from jobqueue.models import FairnessKey

from ..pagination import ByKey
from ..schema import COMMON, WITH_BODY, errors
from ..serializers.fairness import FairnessKeyPage, FairnessKeySerializer, FairnessWeightInput
from ..serializers.shared_instances import represent
from .base import PAGE_PARAMS, PRODUCER_TAGS, ApiViewSet

# The key is text, the rest of the path (agents/urls.py: the `restofpath` converter), as a
# rate limit's (agents/views/ratelimits.py).
KEY_PARAM = OpenApiParameter(
    "key", OpenApiTypes.STR, OpenApiParameter.PATH,
    description="The fairness_key: 1 to 255 printable characters (else 400), "
    "percent-encoded (a space as %20, % as %25; a / may be sent as it is or as %2F; a key "
    "that is . or .. as %2E or %2E%2E, which clients would otherwise resolve away).",
)
NO_WEIGHT = "No weight set for this key."


class FairnessKeyViewSet(ApiViewSet):
    # workspaces/{workspace_id}/fairness-keys[/{key}]
    lookup_url_kwarg = "key"
    lookup_value_converter = "restofpath"  # the rest of the path: a key may hold "/"
    route_names = {"list": "Fairness Keys", "detail": "Fairness Key Detail"}

    def path_key(self) -> str:
        """The key from the path (decoded); one no job could carry is a 400 naming `key`."""
        return inputs.key_text(self.kwargs["key"], "key")

    @extend_schema(
        tags=PRODUCER_TAGS,
        operation_id="list_fairness_keys",
        summary="List the workspace's fairness keys' weights, by key",
        parameters=PAGE_PARAMS,
        responses={200: FairnessKeyPage, **errors(400, *COMMON)},
    )
    def list(self, request, workspace_id):
        keys = FairnessKey.objects.filter(workspace_id=self.principal.workspace_id)
        return self.paginated(ByKey, keys, FairnessKeySerializer)

    @extend_schema(
        tags=PRODUCER_TAGS,
        operation_id="set_fairness_weight",
        summary="Set a fairness key's weight (created or replaced): claims of jobs with "
                "fairness keys are shared among the keys in proportion to their weights",
        parameters=[KEY_PARAM],
        request=FairnessWeightInput,
        responses={200: FairnessKeySerializer, **errors(*WITH_BODY, *COMMON)},
    )
    def update(self, request, workspace_id, key):
        key = self.path_key()
        data = self.validated(FairnessWeightInput)
        weight = inputs.fairness_weight(data["weight"])
        row = fairness.set_weight(self.principal.workspace_id, key, weight)
        return Response(represent(FairnessKeySerializer, row))

    @extend_schema(
        tags=PRODUCER_TAGS,
        operation_id="get_fairness_weight",
        summary="A fairness key's weight; 404 when none is set (the key weighs 1)",
        parameters=[KEY_PARAM],
        responses={200: FairnessKeySerializer, **errors(400, *COMMON)},
    )
    def retrieve(self, request, workspace_id, key):
        row = fairness.get_weight(self.principal.workspace_id, self.path_key())
        if row is None:
            raise NotFound(NO_WEIGHT)
        return Response(represent(FairnessKeySerializer, row))

    @extend_schema(
        tags=PRODUCER_TAGS,
        operation_id="delete_fairness_weight",
        summary="Remove a fairness key's weight: it weighs 1 again; 404 when none is set",
        parameters=[KEY_PARAM],
        responses={204: OpenApiResponse(description="Deleted."), **errors(400, *COMMON)},
    )
    def destroy(self, request, workspace_id, key):
        if not fairness.delete_weight(self.principal.workspace_id, self.path_key()):
            raise NotFound(NO_WEIGHT)
        return Response(status=status.HTTP_204_NO_CONTENT)
