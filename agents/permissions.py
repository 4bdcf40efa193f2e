"""What a credential may touch.

Order of the checks: authenticated (401), the workspace in the path is the credential's (404),
the agent or job in the path is the agent token's own (404), then the role (403). So another
workspace's or agent's objects answer 404 on every endpoint, and an agent token gets 403 only
on producer/operator endpoints about its own agent or jobs.
"""

from __future__ import annotations

from rest_framework.exceptions import NotFound
from rest_framework.permissions import BasePermission

from jobqueue.models import Job


def _principal(request):
    user = getattr(request, "user", None)
    return user if getattr(user, "is_authenticated", False) and hasattr(user, "kind") else None


class InWorkspace(BasePermission):
    """The credential belongs to the workspace in the path; agent tokens only reach their
    own agent (`agent_id` in the path) and their own jobs (`job_id`, checked by the view's
    scoped lookups)."""

    def has_permission(self, request, view):
        principal = _principal(request)
        if principal is None:
            return False
        if view.path_uuid("workspace_id") != principal.workspace_id:
            raise NotFound("No such workspace.")
        if principal.is_agent and "agent_id" in view.kwargs:
            if view.path_uuid("agent_id") != principal.job_agent_id:
                raise NotFound("No such job agent.")
        return True


class WorkspaceKeyOnly(BasePermission):
    """Producer and operator endpoints: a workspace API key. An agent token gets 403 on its
    own agent and jobs, and 404 on anything else (it cannot learn what exists)."""

    message = "An agent token cannot do this; use the workspace API key."

    def has_permission(self, request, view):
        principal = _principal(request)
        if principal is None:
            return False
        if not principal.is_agent:
            return True
        if "job_id" in view.kwargs:
            own = Job.objects.filter(
                id=view.path_uuid("job_id"), job_agent_id=principal.job_agent_id
            ).exists()
            if not own:
                raise NotFound("No such job.")
        return False
