"""The HTTP API: thin views. Each validates, calls one lifecycle function, renders.

Base path /v1/workspaces/{workspace_id}/. Agent endpoints accept an agent token (its own
agent and jobs only) or the workspace API key; producer/operator endpoints need the key.
"""

from __future__ import annotations

import uuid

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    PolymorphicProxySerializer,
    extend_schema,
)
from rest_framework import status
from rest_framework.exceptions import NotFound, UnsupportedMediaType, ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from jobqueue import lifecycle, states
from jobqueue.db import Now
from jobqueue.lifecycle.inputs import parse_uuid
from jobqueue.models import Job, JobAgent, JobClaim, Workspace

from . import credentials, health
from . import serializers as s
from .authentication import AgentTokenAuthentication, ApiKeyAuthentication
from .pagination import ByName, ClaimOrder, NewestFirst
from .parsers import StrictJSONParser
from .permissions import InWorkspace, WorkspaceKeyOnly
from .schema import COMMON, WITH_BODY, errors
from .throttling import CredentialRateThrottle

MAX_EVENTS = 500
AGENT = ["agent"]
PRODUCER = ["producer and operator"]

STATUS_PARAM = OpenApiParameter(
    "status", OpenApiTypes.STR, enum=sorted(states.ALL), required=False,
    description="Filter by status.",
)
PAGE_PARAMS = [
    OpenApiParameter("cursor", OpenApiTypes.STR, required=False,
                     description="Opaque cursor from `next`/`previous`."),
    OpenApiParameter("page_size", OpenApiTypes.INT, required=False,
                     description="1 to 500 (default 100)."),
]


class ApiView(APIView):
    authentication_classes = [AgentTokenAuthentication, ApiKeyAuthentication]
    permission_classes = [InWorkspace]
    throttle_classes = [CredentialRateThrottle]
    parser_classes = [StrictJSONParser]

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        if request.method in ("POST", "PUT", "PATCH") and _has_body(request):
            media = (request.content_type or "").split(";")[0].strip().lower()
            if media != "application/json":
                raise UnsupportedMediaType(media or "(none)")

    def path_uuid(self, name: str) -> uuid.UUID:
        """A UUID from the path; a malformed one is a 404, like an unknown one."""
        value = parse_uuid(self.kwargs.get(name))
        if value is None:
            raise NotFound("Not found.")
        return value

    # -- helpers shared by the endpoints --

    @property
    def principal(self):
        return self.request.user

    def agent_in_path(self) -> JobAgent:
        if self.principal.is_agent:  # InWorkspace checked it is the token's own agent
            return self.principal.job_agent
        agent = JobAgent.objects.filter(
            id=self.path_uuid("agent_id"), workspace_id=self.principal.workspace_id
        ).first()
        if agent is None:
            raise NotFound("No such job agent.")
        return agent

    def job_scope(self) -> dict:
        """Lifecycle scope for an agent write: the token's agent, or the key's workspace."""
        if self.principal.is_agent:
            return {"job_agent_id": self.principal.job_agent_id}
        return {"workspace_id": self.principal.workspace_id}

    def validated(self, serializer_class, data=None):
        ser = serializer_class(data=self.request.data if data is None else data)
        ser.is_valid(raise_exception=True)
        return ser.validated_data


class ProducerView(ApiView):
    permission_classes = [InWorkspace, WorkspaceKeyOnly]


def _has_body(request) -> bool:
    try:
        return int(request.META.get("CONTENT_LENGTH") or 0) > 0
    except ValueError:
        return False


def _status_filter(request, default=None):
    value = request.query_params.get("status", default)
    if value is not None and value not in states.ALL:
        raise ValidationError({"status": ["Must be one of: " + ", ".join(sorted(states.ALL))]})
    return value


def claim_body(grant) -> dict:
    return s.represent(s.ClaimResponseSerializer, grant)


# --- agent endpoints ---------------------------------------------------------------------


class AgentJobsView(ApiView):
    @extend_schema(
        tags=AGENT,
        operation_id="poll_jobs",
        summary="Poll an agent's jobs (lightweight, never dispatch_context)",
        description="`status=queued` (the default) lists the jobs claimable now, in claim "
        "order. Side-effect free.",
        parameters=[STATUS_PARAM, *PAGE_PARAMS],
        responses={200: s.JobListItemPage, **errors(400, *COMMON)},
    )
    def get(self, request, workspace_id, agent_id):
        status_value = _status_filter(request, default=states.QUEUED)
        agent = self.agent_in_path()
        jobs = Job.objects.filter(job_agent_id=agent.id)
        jobs = jobs.claimable() if status_value == states.QUEUED else jobs.filter(
            status=status_value
        )
        paginator = ClaimOrder()
        page = paginator.paginate_queryset(jobs.only(*s.LIST_ITEM_FIELDS), request, self)
        return paginator.get_paginated_response(s.JobListItemSerializer(page, many=True).data)


class ClaimJobView(ApiView):
    @extend_schema(
        tags=AGENT,
        operation_id="claim_job",
        summary="Claim this job (at most once)",
        request=None,
        responses={
            200: s.ClaimResponseSerializer,
            **errors(409, 411, 413, 415, *COMMON),
        },
    )
    def post(self, request, workspace_id, agent_id, job_id):
        agent = self.agent_in_path()
        grant = lifecycle.claim_job(agent, self.path_uuid("job_id"))
        return Response(claim_body(grant))


class ClaimNextView(ApiView):
    @extend_schema(
        tags=AGENT,
        operation_id="claim_next_job",
        summary="Claim the next job (SKIP LOCKED), or a batch with {\"limit\": N}",
        request=s.ClaimNextInput,
        responses={
            200: PolymorphicProxySerializer(
                component_name="ClaimNextResponse",
                serializers=[s.ClaimResponseSerializer, s.BatchClaimResponseSerializer],
                resource_type_field_name=None,
            ),
            204: OpenApiResponse(description="Nothing is claimable now (single claim only)."),
            **errors(*WITH_BODY, *COMMON),
        },
    )
    def post(self, request, workspace_id, agent_id):
        # The usual request has no body or `{}`: nothing to validate.
        body = request.data
        data = {} if isinstance(body, dict) and not body else self.validated(s.ClaimNextInput)
        agent = self.agent_in_path()
        if "limit" in data:
            grants = lifecycle.claim_next_jobs(agent, data["limit"])
            return Response({"claims": [claim_body(g) for g in grants]})
        grant = lifecycle.claim_next_job(agent)
        if grant is None:
            return Response(status=status.HTTP_204_NO_CONTENT)
        return Response(claim_body(grant))


class HeartbeatView(ApiView):
    @extend_schema(
        tags=AGENT,
        operation_id="heartbeat",
        summary="Extend the lease (never revives an expired one)",
        request=s.HeartbeatInput,
        responses={200: s.HeartbeatResponseSerializer, **errors(409, *WITH_BODY, *COMMON)},
    )
    def post(self, request, workspace_id, job_id):
        data = self.validated(s.HeartbeatInput)
        result = lifecycle.heartbeat(self.path_uuid("job_id"), data["claim_id"], **self.job_scope())
        return Response(s.represent(s.HeartbeatResponseSerializer, result))


class StatusView(ApiView):
    @extend_schema(
        tags=AGENT,
        operation_id="report_status",
        summary="Report progress (in_progress) or a terminal status",
        request=s.StatusInput,
        responses={200: s.JobSerializer, **errors(409, *WITH_BODY, *COMMON)},
    )
    def put(self, request, workspace_id, job_id):
        data = self.validated(s.StatusInput)
        job = lifecycle.report_status(
            self.path_uuid("job_id"),
            data["claim_id"],
            data["status"],
            message=data.get("message"),
            result=data.get("result"),
            external_id=data.get("external_id"),
            **self.job_scope(),
        )
        return Response(s.represent(s.JobSerializer, job))


class ReleaseView(ApiView):
    @extend_schema(
        tags=AGENT,
        operation_id="release_job",
        summary="Give the job back to the queue",
        request=s.ReleaseInput,
        responses={200: s.JobSerializer, **errors(409, *WITH_BODY, *COMMON)},
    )
    def post(self, request, workspace_id, job_id):
        data = self.validated(s.ReleaseInput)
        job = lifecycle.release_job(
            self.path_uuid("job_id"),
            data["claim_id"],
            reason=data.get("reason", ""),
            retry_after_seconds=data.get("retry_after_seconds"),
            **self.job_scope(),
        )
        return Response(s.represent(s.JobSerializer, job))


# --- producer and operator endpoints -------------------------------------------------------


class JobsView(ProducerView):
    @extend_schema(
        tags=PRODUCER,
        operation_id="list_jobs",
        summary="List jobs, newest first",
        parameters=[
            STATUS_PARAM,
            OpenApiParameter("job_agent_id", OpenApiTypes.UUID, required=False),
            *PAGE_PARAMS,
        ],
        responses={200: s.JobPage, **errors(400, *COMMON)},
    )
    def get(self, request, workspace_id):
        jobs = Job.objects.filter(workspace_id=self.principal.workspace_id)
        status_value = _status_filter(request)
        if status_value:
            jobs = jobs.filter(status=status_value)
        agent_id = request.query_params.get("job_agent_id")
        if agent_id is not None:
            if (agent_uuid := parse_uuid(agent_id)) is None:
                raise ValidationError({"job_agent_id": ["Must be a valid UUID."]})
            jobs = jobs.filter(job_agent_id=agent_uuid)
        paginator = NewestFirst()
        page = paginator.paginate_queryset(jobs.defer(*s.JOB_LIST_DEFER), request, self)
        return paginator.get_paginated_response(s.JobSerializer(page, many=True).data)

    @extend_schema(
        tags=PRODUCER,
        operation_id="create_job",
        summary="Create a job (queued, or pending with hold)",
        parameters=[
            OpenApiParameter(
                "Idempotency-Key", OpenApiTypes.STR, OpenApiParameter.HEADER, required=False,
                description="1-255 characters. A replay with the same body returns the first "
                "job (200); the same key with another body is 422.",
            )
        ],
        request=s.JobCreateInput,
        responses={
            201: s.JobSerializer,
            200: OpenApiResponse(s.JobSerializer, description="Idempotent replay."),
            **errors(422, *WITH_BODY, *COMMON),
        },
    )
    def post(self, request, workspace_id):
        data = self.validated(s.JobCreateInput)
        agent = (
            JobAgent.objects.select_related("workspace")
            .filter(id=data["job_agent_id"], workspace_id=self.principal.workspace_id)
            .first()
        )
        if agent is None:
            raise ValidationError({"job_agent_id": ["No such job agent in this workspace."]})
        job, created = lifecycle.create_job(
            workspace=agent.workspace,
            job_agent=agent,
            job_agent_config=data["job_agent_config"],
            dispatch_context=data["dispatch_context"],
            priority=data["priority"],
            max_attempts=data.get("max_attempts"),
            delay_seconds=data.get("delay_seconds"),
            external_id=data["external_id"],
            idempotency_key=request.headers.get("Idempotency-Key"),
            hold=data["hold"],
            actor=self.principal.actor,
        )
        return Response(
            s.JobSerializer(job).data,
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        )


class JobDetailView(ProducerView):
    @extend_schema(
        tags=PRODUCER,
        operation_id="get_job",
        summary="A job with its claim state and timeline (dispatch_context redacted)",
        responses={200: s.JobDetailSerializer, **errors(*COMMON)},
    )
    def get(self, request, workspace_id, job_id):
        job = (
            Job.objects.filter(
                id=self.path_uuid("job_id"), workspace_id=self.principal.workspace_id
            )
            .annotate(db_now=Now())
            .first()
        )
        if job is None:
            raise NotFound("No such job.")
        events = list(job.events.order_by("-id")[:MAX_EVENTS])[::-1]
        context = {
            "db_now": job.db_now,
            "claim": JobClaim.objects.filter(job_id=job.id).first(),
            "events": events,
        }
        return Response(s.JobDetailSerializer(job, context=context).data)


class _OperatorTransition(ProducerView):
    transition = None  # a lifecycle function(job_id, *, actor, reason, workspace_id)

    def post(self, request, workspace_id, job_id):
        data = self.validated(s.ReasonInput)
        job = type(self).transition(
            self.path_uuid("job_id"),
            actor=self.principal.actor,
            reason=data.get("reason", ""),
            workspace_id=self.principal.workspace_id,
        )
        return Response(s.represent(s.JobSerializer, job))


def _transition_schema(operation_id, summary):
    return extend_schema(
        tags=PRODUCER,
        operation_id=operation_id,
        summary=summary,
        request=s.ReasonInput,
        responses={200: s.JobSerializer, **errors(409, *WITH_BODY, *COMMON)},
    )


class CancelView(_OperatorTransition):
    transition = staticmethod(lifecycle.cancel_job)

    @_transition_schema("cancel_job", "Cancel (supersedes a live claim)")
    def post(self, request, workspace_id, job_id):
        return super().post(request, workspace_id, job_id)


class RequeueView(_OperatorTransition):
    transition = staticmethod(lifecycle.requeue_job)

    @_transition_schema("requeue_job", "Requeue now (supersedes a live claim)")
    def post(self, request, workspace_id, job_id):
        return super().post(request, workspace_id, job_id)


class DispatchView(ProducerView):
    @extend_schema(
        tags=PRODUCER,
        operation_id="dispatch_job",
        summary="Dispatch a held job (pending -> queued)",
        request=None,
        responses={200: s.JobSerializer, **errors(409, 411, 413, 415, *COMMON)},
    )
    def post(self, request, workspace_id, job_id):
        job = lifecycle.dispatch_job(
            self.path_uuid("job_id"),
            workspace_id=self.principal.workspace_id,
            actor=self.principal.actor,
        )
        return Response(s.represent(s.JobSerializer, job))


class JobAgentsView(ProducerView):
    @extend_schema(
        tags=PRODUCER,
        operation_id="list_job_agents",
        summary="List job agents with their health",
        parameters=PAGE_PARAMS,
        responses={200: s.JobAgentPage, **errors(400, *COMMON)},
    )
    def get(self, request, workspace_id):
        agents = health.with_health(
            JobAgent.objects.filter(workspace_id=self.principal.workspace_id)
        )
        paginator = ByName()
        page = paginator.paginate_queryset(agents, request, self)
        return paginator.get_paginated_response(s.JobAgentSerializer(page, many=True).data)

    @extend_schema(
        tags=PRODUCER,
        operation_id="create_job_agent",
        summary="Create a job agent (issue its tokens with POST .../tokens)",
        request=s.JobAgentCreateInput,
        responses={201: s.JobAgentSerializer, **errors(*WITH_BODY, *COMMON)},
    )
    def post(self, request, workspace_id):
        data = self.validated(s.JobAgentCreateInput)
        agent = lifecycle.create_job_agent(
            workspace=_workspace(self.principal.workspace_id),
            name=data["name"],
            lease_seconds=data.get("lease_seconds"),
            max_attempts=data.get("max_attempts"),
        )
        return Response(s.JobAgentSerializer(agent).data, status=status.HTTP_201_CREATED)


def _workspace(workspace_id):
    return Workspace.objects.get(id=workspace_id)


class JobAgentDetailView(ProducerView):
    @extend_schema(
        tags=PRODUCER,
        operation_id="get_job_agent",
        summary="A job agent with its health",
        responses={200: s.JobAgentSerializer, **errors(*COMMON)},
    )
    def get(self, request, workspace_id, agent_id):
        agent = (
            health.with_health(JobAgent.objects.filter(workspace_id=self.principal.workspace_id))
            .filter(id=self.path_uuid("agent_id"))
            .first()
        )
        if agent is None:
            raise NotFound("No such job agent.")
        return Response(s.JobAgentSerializer(agent).data)


class TokensView(ProducerView):
    @extend_schema(
        tags=PRODUCER,
        operation_id="issue_agent_token",
        summary="Issue an agent token (the secret is returned once)",
        request=s.TokenCreateInput,
        responses={201: s.TokenSerializer, **errors(*WITH_BODY, *COMMON)},
    )
    def post(self, request, workspace_id, agent_id):
        data = self.validated(s.TokenCreateInput)
        agent = self.agent_in_path()
        token, raw = credentials.create_agent_token(agent, name=data["name"])
        token.refresh_from_db(fields=["created_at"])
        body = {"id": token.id, "name": token.name, "token": raw, "created_at": token.created_at}
        return Response(s.TokenSerializer(body).data, status=status.HTTP_201_CREATED)


class TokenDetailView(ProducerView):
    @extend_schema(
        tags=PRODUCER,
        operation_id="revoke_agent_token",
        summary="Revoke an agent token (immediate; idempotent)",
        responses={204: OpenApiResponse(description="Revoked."), **errors(*COMMON)},
    )
    def delete(self, request, workspace_id, agent_id, token_id):
        agent = self.agent_in_path()
        token = agent.tokens.filter(id=self.path_uuid("token_id")).first()
        if token is None:
            raise NotFound("No such token.")
        credentials.revoke_agent_token(token)
        return Response(status=status.HTTP_204_NO_CONTENT)
