"""A workspace's cron schedules (workspace key): create, list, read, change (pause, resume),
delete, and trigger one now. Maintenance fires them (jobqueue/maintenance/schedules.py)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from jobqueue.db import db_now
from jobqueue.lifecycle import schedules
from jobqueue.models import JobAgent, Schedule, Workspace

from ..pagination import NewestFirst
from ..schema import COMMON, WITH_BODY, errors
from ..serializers.fields import EmptyInput
from ..serializers.jobs import JobCreatedSerializer, JobSerializer
from ..serializers.schedules import (
    ScheduleCreateInput,
    SchedulePage,
    ScheduleSerializer,
    ScheduleUpdateInput,
)
from .base import PAGE_PARAMS, PRODUCER_TAGS, ApiViewSet


def _with_next_fires(items):
    """The schedules, each with its next_fire_times (one clock read for all)."""
    now = db_now()
    for schedule in items:
        schedule.next_fire_times = schedules.next_fire_times(schedule, now)
    return items


class ScheduleViewSet(ApiViewSet):
    # workspaces/{workspace_id}/schedules[/{schedule_id}[/trigger]]
    lookup_url_kwarg = "schedule_id"
    route_names = {"list": "Schedules", "detail": "Schedule Detail"}

    def _agent(self, job: dict) -> JobAgent | None:
        if "job_agent_id" not in job:  # a labelled job (ScheduleJobInput: one of the two)
            return None
        agent = JobAgent.objects.select_related("workspace").filter(
            id=job["job_agent_id"], workspace_id=self.principal.workspace_id).first()
        if agent is None:
            raise ValidationError({"job": {"job_agent_id": [
                "No such job agent in this workspace."]}})
        return agent

    def _render(self, schedule: Schedule, status_code=status.HTTP_200_OK) -> Response:
        _with_next_fires([schedule])
        return Response(ScheduleSerializer(schedule).data, status=status_code)

    @extend_schema(
        tags=PRODUCER_TAGS,
        operation_id="list_schedules",
        summary="List schedules, newest first",
        parameters=PAGE_PARAMS,
        responses={200: SchedulePage, **errors(400, *COMMON)},
    )
    def list(self, request, workspace_id):
        items = Schedule.objects.filter(workspace_id=self.principal.workspace_id)
        paginator = NewestFirst()
        page = _with_next_fires(paginator.paginate_queryset(items, request, self))
        return paginator.get_paginated_response(ScheduleSerializer(page, many=True).data)

    @extend_schema(
        tags=PRODUCER_TAGS,
        operation_id="create_schedule",
        summary="Create a cron schedule: maintenance creates its job at each fire time",
        request=ScheduleCreateInput,
        responses={201: ScheduleSerializer, **errors(*WITH_BODY, *COMMON)},
    )
    def create(self, request, workspace_id):
        data = self.validated(ScheduleCreateInput)
        agent = self._agent(data["job"])
        schedule = schedules.create_schedule(
            workspace=Workspace(id=self.principal.workspace_id), name=data["name"],
            cron_expr=data["cron"],
            timezone=data["timezone"], job_agent=agent, job=_job_fields(data["job"]),
            overlap=data["overlap"], catchup_window_seconds=data["catchup_window_seconds"],
            paused=data["paused"])
        return self._render(schedule, status.HTTP_201_CREATED)

    @extend_schema(
        tags=PRODUCER_TAGS,
        operation_id="get_schedule",
        summary="A schedule, with its next 5 fire times",
        responses={200: ScheduleSerializer, **errors(*COMMON)},
    )
    def retrieve(self, request, workspace_id, schedule_id):
        return self._render(schedules.get_schedule(
            self.path_uuid("schedule_id"), workspace_id=self.principal.workspace_id))

    @extend_schema(
        tags=PRODUCER_TAGS,
        operation_id="update_schedule",
        summary="Change a schedule; {\"paused\": true} pauses it, false resumes it",
        request=ScheduleUpdateInput,
        responses={200: ScheduleSerializer, **errors(*WITH_BODY, *COMMON)},
    )
    def partial_update(self, request, workspace_id, schedule_id):
        data = self.validated(ScheduleUpdateInput)
        schedule_id = self.path_uuid("schedule_id")
        agent = None
        if "job" in data:
            schedules.get_schedule(schedule_id, workspace_id=self.principal.workspace_id)
            agent = self._agent(data["job"])
            data["job"] = _job_fields(data["job"])
        schedule = schedules.update_schedule(
            schedule_id, workspace_id=self.principal.workspace_id, job_agent=agent, **data)
        return self._render(schedule)

    @extend_schema(
        tags=PRODUCER_TAGS,
        operation_id="delete_schedule",
        summary="Delete a schedule (its jobs stay)",
        responses={204: OpenApiResponse(description="Deleted."), **errors(*COMMON)},
    )
    def destroy(self, request, workspace_id, schedule_id):
        schedules.delete_schedule(self.path_uuid("schedule_id"),
                                  workspace_id=self.principal.workspace_id)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        tags=PRODUCER_TAGS,
        operation_id="trigger_schedule",
        summary="Fire now, paused or not, whatever the overlap policy: the job counts as the "
                "schedule's latest",
        request=None,
        responses={
            201: JobCreatedSerializer,
            200: OpenApiResponse(JobCreatedSerializer, description="The schedule's job has a "
                                 "unique_key and a live job with it was answered "
                                 "(deduplicated true)."),
            **errors(409, *WITH_BODY, *COMMON),
        },
    )
    @action(detail=True, methods=["post"], name="Trigger Schedule")
    def trigger(self, request, workspace_id, schedule_id):
        self.validated(EmptyInput)  # no body, or {}
        made = schedules.trigger_schedule(self.path_uuid("schedule_id"),
                                          workspace_id=self.principal.workspace_id,
                                          actor=self.principal.actor)
        return Response(
            {**JobSerializer(made.job).data, "deduplicated": made.deduplicated},
            status=status.HTTP_201_CREATED if made.created else status.HTTP_200_OK,
        )


def _job_fields(job: dict) -> dict:
    """POST jobs' validated body as a schedule keeps it: JSON values, job_agent_id apart."""
    kept = {k: v for k, v in job.items() if k != "job_agent_id"}
    if kept.get("expires_at") is not None:
        kept["expires_at"] = kept["expires_at"].isoformat()
    return kept
