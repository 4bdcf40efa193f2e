"""Why isn't my job running? `GET jobs/{job_id}/explain` (workspace key): what the claim
rule says of the job now, in words (jobqueue/explain.py)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.decorators import action
from rest_framework.response import Response

from jobqueue.explain import explain_job

from ..schema import COMMON, errors
from ..serializers.explain import ExplanationSerializer
from .base import PRODUCER, PRODUCER_TAGS, ApiViewSet


class JobExplainViewSet(ApiViewSet):
    # workspaces/{workspace_id}/jobs/{job_id}/explain

    @extend_schema(
        tags=PRODUCER_TAGS,
        operation_id="explain_job",
        summary="Why isn't the job running? Whether the next claim of a matching agent takes "
        "it, and the reasons it does not (read-only)",
        description="Computed from the rule claims use, on the database's clock: `claimable` "
        "says whether a claim by an agent the job is routed to would take it now; empty "
        "`reasons` with `claimable` true: the next such claim takes it. `no_matching_agent` "
        "and `no_matching_agent_online` may stand beside `claimable` true.",
        responses={200: ExplanationSerializer, **errors(*COMMON)},
    )
    @action(detail=False, methods=["get"], url_path="explain", url_name="explain",
            permission_classes=PRODUCER, name="Explain")
    def explain(self, request, workspace_id, job_id):
        found = explain_job(self.path_uuid("job_id"), workspace_id=self.principal.workspace_id)
        return Response(ExplanationSerializer(found).data)
