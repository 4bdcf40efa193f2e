"""Groups of jobs (a run's jobs): their state, and their cancel (workspace key)."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound
from rest_framework.response import Response

from jobqueue import lifecycle
from jobqueue.exceptions import InvalidInput
from jobqueue.lifecycle.inputs import group_name

from ..schema import COMMON, WITH_BODY, errors
from ..serializers.fields import ReasonInput
from ..serializers.groups import GroupCancelSerializer, GroupSerializer
from .base import PRODUCER_TAGS, ApiViewSet

# The group is a name, not a UUID (the anyid converter is typed as a UUID everywhere else).
GROUP_PARAM = OpenApiParameter(
    "group", OpenApiTypes.STR, OpenApiParameter.PATH,
    description='The group: 1 to 200 printable characters without "/", not "." or "..".',
)


class GroupViewSet(ApiViewSet):
    # workspaces/{workspace_id}/groups/{group}[/cancel]
    lookup_url_kwarg = "group"
    route_names = {"detail": "Group Detail"}

    def path_group(self) -> str:
        """The group from the path; one no job could have (a NUL, a "/") is a 404."""
        try:
            return group_name(self.kwargs["group"])
        except InvalidInput as exc:
            raise NotFound("No such group.") from exc

    @extend_schema(
        tags=PRODUCER_TAGS,
        operation_id="get_group",
        summary="A group's jobs by status, whether it finished, whether it was cancelled",
        parameters=[GROUP_PARAM],
        responses={200: GroupSerializer, **errors(*COMMON)},
    )
    def retrieve(self, request, workspace_id, group):
        state = lifecycle.group_state(self.principal.workspace_id, self.path_group())
        return Response(GroupSerializer(state).data)

    @extend_schema(
        tags=PRODUCER_TAGS,
        operation_id="cancel_group",
        summary="Cancel every live job of the group and refuse new ones (bounded batches)",
        parameters=[GROUP_PARAM],
        request=ReasonInput,
        responses={200: GroupCancelSerializer, **errors(*WITH_BODY, *COMMON)},
    )
    @action(detail=True, methods=["post"], name="Cancel")
    def cancel(self, request, workspace_id, group):
        data = self.validated(ReasonInput)
        n = lifecycle.cancel_group(self.principal.workspace_id, self.path_group(),
                                   actor=self.principal.actor, reason=data.get("reason", ""))
        return Response({"cancelled": n})
