"""Job agents: create, list and look at them (workspace key), and what an agent does through
its own agent: poll, claim a named job or the next one (or a batch), renew many leases and end
many jobs at once (agent token or workspace key)."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    PolymorphicProxySerializer,
    extend_schema,
)
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound
from rest_framework.response import Response

from jobqueue import claimrule, fencing, lifecycle, states
from jobqueue.lifecycle import records
from jobqueue.models import Job, JobAgent, Workspace

from .. import health
from ..pagination import ByName, ClaimOrder
from ..schema import COMMON, WITH_BODY, errors
from ..serializers.fields import ReasonInput
from ..serializers.job_agents import (
    LIST_ITEM_FIELDS,
    BatchClaimResponseSerializer,
    BatchHeartbeatInput,
    BatchHeartbeatResponse,
    BatchReportInput,
    BatchReportResponse,
    ClaimInput,
    ClaimNextInput,
    ClaimResponseSerializer,
    JobAgentCreateInput,
    JobAgentPage,
    JobAgentSerializer,
    JobAgentUpdateInput,
    JobListItemPage,
    JobListItemSerializer,
)
from ..serializers.shared_instances import represent
from .base import (
    AGENT,
    AGENT_TAGS,
    PAGE_PARAMS,
    PRODUCER_TAGS,
    STATUS_PARAM,
    ApiViewSet,
    claim_body,
    client_gone,
    status_filter,
    write_schema,
)


class JobAgentViewSet(ApiViewSet):
    # workspaces/{workspace_id}/job-agents[/{agent_id}[/...]]
    lookup_url_kwarg = "agent_id"
    route_names = {"list": "Job Agents", "detail": "Job Agent Detail"}

    # --- producer and operator: the agents themselves

    @extend_schema(
        tags=PRODUCER_TAGS,
        operation_id="list_job_agents",
        summary="List job agents with their health",
        parameters=PAGE_PARAMS,
        responses={200: JobAgentPage, **errors(400, *COMMON)},
    )
    def list(self, request, workspace_id):
        agents = health.with_health(
            JobAgent.objects.filter(workspace_id=self.principal.workspace_id)
        )
        return self.paginated(ByName, agents, JobAgentSerializer)

    @extend_schema(
        tags=PRODUCER_TAGS,
        operation_id="create_job_agent",
        summary="Create a job agent (issue its tokens with POST .../tokens)",
        request=JobAgentCreateInput,
        responses={201: JobAgentSerializer, **errors(*WITH_BODY, *COMMON)},
    )
    def create(self, request, workspace_id):
        data = self.validated(JobAgentCreateInput)
        agent = lifecycle.create_job_agent(
            workspace=Workspace.objects.get(id=self.principal.workspace_id),
            name=data["name"],
            lease_seconds=data.get("lease_seconds"),
            max_attempts=data.get("max_attempts"),
            max_runtime_seconds=data.get("max_runtime_seconds"),
            labels=data["labels"],
        )
        return Response(JobAgentSerializer(agent).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        tags=PRODUCER_TAGS,
        operation_id="update_job_agent",
        summary="Change a job agent's labels or defaults (the fields given)",
        request=JobAgentUpdateInput,
        responses={200: JobAgentSerializer, **errors(*WITH_BODY, *COMMON)},
    )
    def partial_update(self, request, workspace_id, agent_id):
        data = self.validated(JobAgentUpdateInput)
        agent = lifecycle.update_job_agent(self.agent_in_path(), **data)
        agent = health.with_health(JobAgent.objects.filter(id=agent.id)).get()
        return Response(JobAgentSerializer(agent).data)

    @extend_schema(
        tags=PRODUCER_TAGS,
        operation_id="get_job_agent",
        summary="A job agent with its health",
        responses={200: JobAgentSerializer, **errors(*COMMON)},
    )
    def retrieve(self, request, workspace_id, agent_id):
        agent = (
            health.with_health(JobAgent.objects.filter(workspace_id=self.principal.workspace_id))
            .filter(id=self.path_uuid("agent_id"))
            .first()
        )
        if agent is None:
            raise NotFound("No such job agent.")
        return Response(JobAgentSerializer(agent).data)

    @write_schema(PRODUCER_TAGS, "pause_job_agent",
                  "Pause the agent's claims (204 / empty until resumed; jobs in flight go on)",
                  ReasonInput, JobAgentSerializer)
    @action(detail=True, methods=["post"], url_path="pause", url_name="pause", name="Pause")
    def pause(self, request, workspace_id, agent_id):
        return self._pause_or_resume(lifecycle.pause_job_agent)

    @write_schema(PRODUCER_TAGS, "resume_job_agent", "Resume a paused agent's claims",
                  ReasonInput, JobAgentSerializer)
    @action(detail=True, methods=["post"], url_path="resume", url_name="resume", name="Resume")
    def resume(self, request, workspace_id, agent_id):
        return self._pause_or_resume(lifecycle.resume_job_agent)

    def _pause_or_resume(self, transition):
        # Idempotent: pausing a paused agent (resuming a running one) answers it unchanged.
        data = self.validated(ReasonInput)
        agent = self.agent_in_path()
        transition(agent, self.principal.actor, data.get("reason", ""))
        agent = health.with_health(JobAgent.objects.filter(id=agent.id)).get()
        return Response(JobAgentSerializer(agent).data)

    # --- the agent's own endpoints

    @extend_schema(
        tags=AGENT_TAGS,
        operation_id="poll_jobs",
        summary="Poll an agent's jobs (lightweight, never dispatch_context)",
        description="`status=queued` (the default) lists the jobs claimable now, in claim "
        "order: the agent's own and the labelled jobs its labels match. Another status lists "
        "the agent's jobs in it (a labelled job, once the agent claimed it). Side-effect free.",
        parameters=[STATUS_PARAM, *PAGE_PARAMS],
        responses={200: JobListItemPage, **errors(400, *COMMON)},
    )
    @action(detail=True, methods=["get"], url_path="jobs", url_name="jobs",
            permission_classes=AGENT, name="Agent Jobs")
    def poll(self, request, workspace_id, agent_id):
        status_value = status_filter(request, default=states.QUEUED)
        agent = self.agent_in_path()
        if status_value == states.QUEUED:  # what its claims would take, but for a pause
            jobs = Job.objects.filter(claimrule.routed_to(agent)).claimable()
        else:
            jobs = records.agent_jobs(agent.workspace_id, agent.id, status_value)
        return self.paginated(
            ClaimOrder, jobs.only(*LIST_ITEM_FIELDS), JobListItemSerializer
        )

    @extend_schema(
        tags=AGENT_TAGS,
        operation_id="claim_job",
        summary="Claim this job (at most once)",
        request=ClaimInput,
        responses={
            200: ClaimResponseSerializer,
            **errors(409, *WITH_BODY, *COMMON),
        },
    )
    @action(detail=True, methods=["post"], url_path="jobs/<anyid:job_id>/claim",
            url_name="claim", permission_classes=AGENT, name="Claim Job")
    def claim(self, request, workspace_id, agent_id, job_id):
        body = request.data
        data = {} if isinstance(body, dict) and not body else self.validated(ClaimInput)
        agent = self.agent_in_path()
        fencing.signing_key()  # a key that cannot sign fails here, before anything is claimed
        grant = lifecycle.claim_job(agent, self.path_uuid("job_id"), holder=data.get("holder"),
                                    expected_attempt=data.get("expected_attempt"))
        return Response(claim_body(grant))

    @extend_schema(
        tags=AGENT_TAGS,
        operation_id="claim_next_job",
        summary="Claim the next job (SKIP LOCKED), or a batch with {\"limit\": N}",
        parameters=[
            OpenApiParameter(
                "Idempotency-Key", OpenApiTypes.STR, OpenApiParameter.HEADER, required=False,
                description="1-255 printable characters. A retry with the same key by the same "
                "agent gets the claim(s) the key made back while they are current.",
            )
        ],
        request=ClaimNextInput,
        responses={
            200: PolymorphicProxySerializer(
                component_name="ClaimNextResponse",
                serializers=[ClaimResponseSerializer, BatchClaimResponseSerializer],
                resource_type_field_name=None,
            ),
            204: OpenApiResponse(description="Nothing is claimable now (single claim only)."),
            **errors(*WITH_BODY, *COMMON),
        },
    )
    @action(detail=True, methods=["post"], url_path="jobs/claim", url_name="claim-next",
            permission_classes=AGENT, name="Claim Next")
    def claim_next(self, request, workspace_id, agent_id):
        # The usual request has no body or `{}`: nothing to validate.
        body = request.data
        data = {} if isinstance(body, dict) and not body else self.validated(ClaimNextInput)
        agent = self.agent_in_path()
        fencing.signing_key()  # a key that cannot sign fails here, before anything is claimed
        holder = data.get("holder")
        key = request.headers.get("Idempotency-Key")
        grants = lifecycle.claim_next(agent, data.get("limit"), data.get("wait_seconds"),
                                      gone=client_gone(request), holder=holder,
                                      idempotency_key=key)
        if "limit" in data:
            return Response({"claims": [claim_body(g) for g in grants]})
        if not grants:
            return Response(status=status.HTTP_204_NO_CONTENT)
        return Response(claim_body(grants[0]))

    @write_schema(AGENT_TAGS, "heartbeat_many",
                  "Renew many claims of this agent at once; per claim: renewed, or why not",
                  BatchHeartbeatInput, BatchHeartbeatResponse)
    @action(detail=True, methods=["post"], url_path="heartbeat", url_name="heartbeat",
            permission_classes=AGENT, name="Batch Heartbeat")
    def heartbeat_many(self, request, workspace_id, agent_id):
        data = self.validated(BatchHeartbeatInput)
        agent = self.agent_in_path()
        result = lifecycle.heartbeat_many(agent.id, data["claims"])
        return Response(represent(BatchHeartbeatResponse, result))

    @write_schema(AGENT_TAGS, "report_many",
                  "End many jobs of this agent at once; per report: accepted, or why not",
                  BatchReportInput, BatchReportResponse)
    @action(detail=True, methods=["post"], url_path="reports", url_name="reports",
            permission_classes=AGENT, name="Batch Report")
    def report_many(self, request, workspace_id, agent_id):
        data = self.validated(BatchReportInput)
        agent = self.agent_in_path()
        result = lifecycle.report_many(agent.id, data["reports"])
        return Response(represent(BatchReportResponse, result))
