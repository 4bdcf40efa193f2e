"""The effect ledger of a job (docs/effects.md): an agent begins an effect before it acts
outside the service and records its outcome after; the producer lists them."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.response import Response

from jobqueue.lifecycle import effects

from ..schema import COMMON, WITH_BODY, errors
from ..serializers.effects import (
    EffectAnswerSerializer,
    EffectBeginInput,
    EffectCommitInput,
    EffectListSerializer,
    EffectSerializer,
)
from ..serializers.shared_instances import represent
from .base import AGENT, AGENT_TAGS, PRODUCER, PRODUCER_TAGS, ApiViewSet

KEY_PARAM = OpenApiParameter(
    "key", str, OpenApiParameter.PATH, required=True, pattern=r"^[A-Za-z0-9._:-]{1,200}$",
    description="The effect's name within the job, chosen by the agent (`charge-card`, "
    "`email:welcome`): 1 to 200 of A-Z a-z 0-9 . _ : -, not `.` or `..` (else 400).",
)
STATE_ANSWER = OpenApiResponse(
    EffectAnswerSerializer,
    description="unknown (an earlier attempt began it and recorded no outcome) or committed "
    "(with its result).")


def _effect_write(operation_id, summary, request, responses):
    """The schema of an agent's effect write: the key in the path, a JSON body, 409 refusals."""
    return extend_schema(
        tags=AGENT_TAGS, operation_id=operation_id, summary=summary, parameters=[KEY_PARAM],
        request=request, responses={**responses, **errors(409, *WITH_BODY, *COMMON)})


class JobEffectViewSet(ApiViewSet):
    # workspaces/{workspace_id}/jobs/{job_id}/effects

    @extend_schema(
        tags=PRODUCER_TAGS,
        operation_id="list_effects",
        summary="The job's effect ledger: every effect its attempts began, oldest first",
        responses={200: EffectListSerializer, **errors(*COMMON)},
    )
    @action(detail=False, methods=["get"], url_path="effects", url_name="effects",
            permission_classes=PRODUCER, name="Effects")
    def list_effects(self, request, workspace_id, job_id):
        rows = effects.effects_of(self.path_uuid("job_id"),
                                  workspace_id=self.principal.workspace_id)
        return Response({"results": EffectSerializer(rows, many=True).data})

    @_effect_write("begin_effect",
                   "Begin an effect outside the service, or learn that an earlier attempt did",
                   EffectBeginInput,
                   {201: OpenApiResponse(EffectAnswerSerializer,
                                         description="started: this attempt began it (again, "
                                         "for a repeat); do it now, then commit its outcome."),
                    200: STATE_ANSWER})
    @action(detail=False, methods=["post"], url_path="effects/<anyid:key>/begin",
            url_name="effect-begin", permission_classes=AGENT, name="Begin effect")
    def begin_effect(self, request, workspace_id, job_id, key):
        data = self.validated(EffectBeginInput)
        answer = effects.begin_effect(self.path_uuid("job_id"), data["claim_id"], key,
                                      **self.job_scope())
        return Response(represent(EffectAnswerSerializer, answer),
                        status=status.HTTP_201_CREATED if answer.created else status.HTTP_200_OK)

    @_effect_write("commit_effect", "Record the outcome of an effect this attempt began (once)",
                   EffectCommitInput,
                   {200: OpenApiResponse(EffectAnswerSerializer,
                                         description="committed (or the same result again).")})
    @action(detail=False, methods=["put"], url_path="effects/<anyid:key>",
            url_name="effect", permission_classes=AGENT, name="Effect")
    def commit_effect(self, request, workspace_id, job_id, key):
        data = self.validated(EffectCommitInput)
        answer = effects.commit_effect(self.path_uuid("job_id"), data["claim_id"], key,
                                       data["result"], **self.job_scope())
        return Response(represent(EffectAnswerSerializer, answer))
