"""Flows: a graph of jobs with their dependencies, created at once (workspace key)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.response import Response

from jobqueue import lifecycle
from jobqueue.exceptions import InvalidInput
from jobqueue.lifecycle import dependencies
from jobqueue.models import JobAgent, Workspace

from ..schema import COMMON, WITH_BODY, errors
from ..serializers.jobs import FlowCreatedSerializer, FlowCreateInput, JobSerializer
from .base import PRODUCER_TAGS, ApiViewSet

FIELDS = ("job_agent_config", "dispatch_context", "priority", "max_attempts", "delay_seconds",
          "retry_backoff_seconds", "max_runtime_seconds", "expires_at", "external_id", "group",
          "depends_on_refs", "depends_on", "concurrency_key", "concurrency_limit",
          "rate_limit_key", "fairness_key")


class FlowViewSet(ApiViewSet):
    # workspaces/{workspace_id}/flows
    route_names = {"list": "Flows"}

    @extend_schema(
        tags=PRODUCER_TAGS,
        operation_id="create_flow",
        summary="Create a graph of jobs at once (each may depend on earlier ones)",
        description="All of it or nothing, in one transaction. A job waits pending until the "
        "jobs it depends on are all successful, then is queued; it ends cancelled "
        "(dependency_failed) when one of them ends otherwise. Bad input is a 400 whose field "
        "names the job's index: `jobs[3].depends_on_refs`.",
        request=FlowCreateInput,
        responses={201: FlowCreatedSerializer, **errors(*WITH_BODY, *COMMON)},
    )
    def create(self, request, workspace_id):
        data = self.validated(FlowCreateInput)
        wanted = {item["job_agent_id"] for item in data["jobs"] if "job_agent_id" in item}
        agents = {a.id: a for a in JobAgent.objects.select_related("workspace").filter(
            id__in=wanted, workspace_id=self.principal.workspace_id)}
        items = []
        for i, item in enumerate(data["jobs"]):
            agent = agents.get(item.get("job_agent_id"))
            if agent is None and "labels" not in item:
                raise InvalidInput("No such job agent in this workspace.",
                                   field=f"jobs[{i}].job_agent_id")
            items.append(lifecycle.FlowJob(ref=item["ref"], job_agent=agent,
                                           labels=item.get("labels"),
                                           **{k: item.get(k) for k in FIELDS if k in item}))
        # The instance by its id: create_flow reads nothing else of it.
        workspace = Workspace(id=self.principal.workspace_id)
        made = lifecycle.create_flow(workspace=workspace, jobs=items,
                                     actor=self.principal.actor)
        dependencies.load_parents(list(made.values()))
        return Response({"jobs": {ref: JobSerializer(job).data for ref, job in made.items()}},
                        status=status.HTTP_201_CREATED)
