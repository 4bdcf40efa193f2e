"""Jobs: create, list and look at them, cancel, requeue and dispatch them (workspace key);
and the writes of the agent that holds a job's claim: heartbeat, status, release (agent token
or workspace key)."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.response import Response

from jobqueue import history, lifecycle
from jobqueue.db import Now
from jobqueue.lifecycle import dependencies, inputs, records
from jobqueue.models import Job, JobAgent, JobClaim, Workspace

from ..pagination import NewestFirst
from ..schema import COMMON, WITH_BODY, ErrorSerializer, errors
from ..serializers.fields import EmptyInput, ReasonInput
from ..serializers.jobs import (
    JOB_LIST_ONLY,
    ClaimCheckSerializer,
    HeartbeatInput,
    HeartbeatResponseSerializer,
    JobCreatedSerializer,
    JobCreateInput,
    JobDetailSerializer,
    JobPage,
    JobSerializer,
    JobSummarySerializer,
    ReleaseInput,
    StatusInput,
)
from ..serializers.shared_instances import represent
from .base import (
    AGENT,
    AGENT_TAGS,
    PAGE_PARAMS,
    PRODUCER_TAGS,
    STATUS_PARAM,
    WAIT_PARAM,
    ApiViewSet,
    client_gone,
    parse_uuid,
    status_filter,
    wait_param,
    write_schema,
)

MAX_EVENTS = 500


class JobViewSet(ApiViewSet):
    # workspaces/{workspace_id}/jobs[/{job_id}[/...]]
    lookup_url_kwarg = "job_id"
    route_names = {"list": "Jobs", "detail": "Job Detail"}

    # --- producer and operator

    @extend_schema(
        tags=PRODUCER_TAGS,
        operation_id="list_jobs",
        summary="List jobs, newest first (summaries: no job_agent_config, result or message)",
        parameters=[
            STATUS_PARAM,
            OpenApiParameter("job_agent_id", OpenApiTypes.UUID, required=False),
            OpenApiParameter("group", OpenApiTypes.STR, required=False,
                             description="Only the jobs of this group."),
            *PAGE_PARAMS,
        ],
        responses={200: JobPage, **errors(400, *COMMON)},
    )
    def list(self, request, workspace_id):
        workspace_id = self.principal.workspace_id
        status_value = status_filter(request)
        raw_agent_id = request.query_params.get("job_agent_id")
        if raw_agent_id is not None:
            agent_id = parse_uuid(raw_agent_id)
            if agent_id is None:
                raise ValidationError({"job_agent_id": ["Must be a valid UUID."]})
            jobs = records.agent_jobs(workspace_id, agent_id, status_value)
        else:
            jobs = Job.objects.filter(workspace_id=workspace_id)
            if status_value:
                jobs = jobs.filter(status=status_value)
        group = request.query_params.get("group")
        if group is not None:
            # A name no job could have (a NUL, which PostgreSQL's text refuses, a "/") is a
            # 400, as on create.
            jobs = jobs.filter(group=inputs.group_name(group))
        return self.paginated(NewestFirst, jobs.only(*JOB_LIST_ONLY), JobSummarySerializer,
                              prepare=dependencies.load_parents)

    @extend_schema(
        tags=PRODUCER_TAGS,
        operation_id="create_job",
        summary="Create a job (queued, or pending with hold)",
        parameters=[
            OpenApiParameter(
                "Idempotency-Key", OpenApiTypes.STR, OpenApiParameter.HEADER, required=False,
                description="1-255 characters. A replay with the same body returns the first "
                "job (200), as it was created, even when a default (the agent's max_attempts) "
                "changed since; the same key with another body is 422. Fields count as sent: "
                "an omitted max_attempts differs from an explicit one.",
            )
        ],
        request=JobCreateInput,
        responses={
            201: JobCreatedSerializer,
            200: OpenApiResponse(JobCreatedSerializer, description="An Idempotency-Key "
                                 "replay, or the live job with the unique_key "
                                 "(deduplicated true)."),
            **errors(422, *WITH_BODY, *COMMON),
            409: OpenApiResponse(ErrorSerializer, description="group_cancelled: a create "
                                 "into a cancelled group; unique_key_conflict: a replace or "
                                 "a debounce whose unique_key met a live job of another job "
                                 "agent (nothing changed, nothing created)."),
        },
    )
    def create(self, request, workspace_id):
        data = self.validated(JobCreateInput)
        agent = None
        if "job_agent_id" in data:
            agent = (
                JobAgent.objects.select_related("workspace")
                .filter(id=data["job_agent_id"], workspace_id=self.principal.workspace_id)
                .first()
            )
            if agent is None:
                raise ValidationError({"job_agent_id": ["No such job agent in this workspace."]})
        made = lifecycle.create_job(
            # A labelled job's workspace is the caller's (the instance by its id: create_job
            # reads nothing else of it).
            workspace=(agent.workspace if agent is not None
                       else Workspace(id=self.principal.workspace_id)),
            job_agent=agent,
            labels=data.get("labels"),
            job_agent_config=data["job_agent_config"],
            dispatch_context=data["dispatch_context"],
            priority=data["priority"],
            max_attempts=data.get("max_attempts"),
            delay_seconds=data.get("delay_seconds"),
            retry_backoff_seconds=data.get("retry_backoff_seconds"),
            max_runtime_seconds=data.get("max_runtime_seconds"),
            expires_at=data.get("expires_at"),
            external_id=data["external_id"],
            idempotency_key=request.headers.get("Idempotency-Key"),
            group=data.get("group"),
            hold=data["hold"],
            unique_key=data.get("unique_key"),
            unique_states=data.get("unique_states"),
            on_conflict=data.get("on_conflict"),
            debounce_seconds=data.get("debounce_seconds"),
            debounce_max_seconds=data.get("debounce_max_seconds"),
            depends_on=data.get("depends_on"),
            concurrency_key=data.get("concurrency_key"),
            concurrency_limit=data.get("concurrency_limit"),
            rate_limit_key=data.get("rate_limit_key"),
            fairness_key=data.get("fairness_key"),
            actor=self.principal.actor,
        )
        return Response(
            {**JobSerializer(made.job).data, "deduplicated": made.deduplicated},
            status=status.HTTP_201_CREATED if made.created else status.HTTP_200_OK,
        )

    @extend_schema(
        tags=PRODUCER_TAGS,
        operation_id="get_job",
        summary="A job with its claim state and timeline (dispatch_context redacted)",
        description="With `wait_seconds`, the answer waits for the job's end (at most that "
        "long): a producer's long-poll.",
        parameters=[WAIT_PARAM],
        responses={200: JobDetailSerializer, **errors(400, *COMMON)},
    )
    def retrieve(self, request, workspace_id, job_id):
        wait = wait_param(request)
        if wait:
            lifecycle.wait_for_job_end(self.path_uuid("job_id"), wait,
                                       workspace_id=self.principal.workspace_id,
                                       gone=client_gone(request))
        job = (
            Job.objects.filter(
                id=self.path_uuid("job_id"), workspace_id=self.principal.workspace_id
            )
            .annotate(db_now=Now())
            .first()
        )
        if job is None:
            raise NotFound("No such job.")
        # The stored events first, then what the job row says, once (history.py).
        events, attempts = history.events_and_attempts(job, MAX_EVENTS)
        context = {
            "db_now": job.db_now,
            "claim": JobClaim.objects.filter(job_id=job.id).first(),
            "events": events,
            "attempts": attempts,
        }
        return Response(JobDetailSerializer(job, context=context).data)

    @write_schema(PRODUCER_TAGS, "cancel_job", "Cancel (supersedes a live claim)",
                  ReasonInput, JobSerializer, 409)
    @action(detail=True, methods=["post"], name="Cancel")
    def cancel(self, request, workspace_id, job_id):
        return self._operator_transition(lifecycle.cancel_job)

    @write_schema(PRODUCER_TAGS, "requeue_job", "Requeue now (supersedes a live claim)",
                  ReasonInput, JobSerializer, 409)
    @action(detail=True, methods=["post"], name="Requeue")
    def requeue(self, request, workspace_id, job_id):
        return self._operator_transition(lifecycle.requeue_job)

    def _operator_transition(self, transition):
        # transition: a lifecycle function(job_id, *, actor, reason, workspace_id)
        data = self.validated(ReasonInput)
        job = transition(
            self.path_uuid("job_id"),
            actor=self.principal.actor,
            reason=data.get("reason", ""),
            workspace_id=self.principal.workspace_id,
        )
        return Response(represent(JobSerializer, job))

    @extend_schema(
        tags=PRODUCER_TAGS,
        operation_id="dispatch_job",
        summary="Dispatch a held job (pending -> queued)",
        request=None,
        responses={200: JobSerializer, **errors(409, 411, 413, 415, *COMMON)},
    )
    @action(detail=True, methods=["post"], url_path="dispatch", url_name="dispatch",
            name="Dispatch")
    def dispatch_job(self, request, workspace_id, job_id):  # not `dispatch`: APIView's own
        self.validated(EmptyInput)  # no body, or {}
        job = lifecycle.dispatch_job(
            self.path_uuid("job_id"),
            workspace_id=self.principal.workspace_id,
            actor=self.principal.actor,
        )
        return Response(represent(JobSerializer, job))

    # --- the claim holder's reads and writes

    @extend_schema(
        tags=AGENT_TAGS,
        operation_id="get_claim_state",
        summary="Is this claim current? Read-only: never extends the lease, writes nothing",
        parameters=[OpenApiParameter("claim_id", OpenApiTypes.UUID, OpenApiParameter.PATH)],
        responses={200: ClaimCheckSerializer, **errors(*COMMON)},
    )
    @action(detail=True, methods=["get"], url_path="claims/<anyid:claim_id>",
            url_name="claim-state", permission_classes=AGENT, name="Claim State")
    def claim_state(self, request, workspace_id, job_id, claim_id):
        check = lifecycle.claim_state(self.path_uuid("job_id"), self.path_uuid("claim_id"),
                                      **self.job_scope())
        return Response(represent(ClaimCheckSerializer, check))

    @write_schema(AGENT_TAGS, "heartbeat", "Extend the lease (never revives an expired one)",
                  HeartbeatInput, HeartbeatResponseSerializer, 409)
    @action(detail=True, methods=["post"], permission_classes=AGENT, name="Heartbeat")
    def heartbeat(self, request, workspace_id, job_id):
        data = self.validated(HeartbeatInput)
        result = lifecycle.heartbeat(self.path_uuid("job_id"), data["claim_id"],
                                     checkpoint=data.get("checkpoint"), **self.job_scope())
        return Response(represent(HeartbeatResponseSerializer, result))

    @write_schema(AGENT_TAGS, "report_status",
                  "Report progress (in_progress) or a terminal status",
                  StatusInput, JobSerializer, 409)
    @action(detail=True, methods=["put"], url_path="status", url_name="status",
            permission_classes=AGENT, name="Status")
    def report_status(self, request, workspace_id, job_id):
        data = self.validated(StatusInput)
        job = lifecycle.report_status(
            self.path_uuid("job_id"),
            data["claim_id"],
            data["status"],
            message=data.get("message"),
            result=data.get("result"),
            external_id=data.get("external_id"),
            retry=data["retry"],
            checkpoint=data.get("checkpoint"),
            **self.job_scope(),
        )
        return Response(represent(JobSerializer, job))

    @write_schema(AGENT_TAGS, "release_job", "Give the job back to the queue",
                  ReleaseInput, JobSerializer, 409)
    @action(detail=True, methods=["post"], permission_classes=AGENT, name="Release")
    def release(self, request, workspace_id, job_id):
        data = self.validated(ReleaseInput)
        job = lifecycle.release_job(
            self.path_uuid("job_id"),
            data["claim_id"],
            reason=data.get("reason", ""),
            retry_after_seconds=data.get("retry_after_seconds"),
            **self.job_scope(),
        )
        return Response(represent(JobSerializer, job))
