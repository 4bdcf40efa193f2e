"""What every viewset of the API shares: credentials, permissions, throttle, the JSON-only
parser and the 415 rule, ids from the path, and the schema's tags and parameters.

The viewsets carry comments, not docstrings: DRF answers OPTIONS with a view's docstring and
drf-spectacular publishes it as the operation's description, and both stay as they were.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Callable

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.exceptions import NotFound, UnsupportedMediaType, ValidationError
from rest_framework.viewsets import ViewSet

from jobqueue import states
from jobqueue.conf import jobqueue_settings
from jobqueue.lifecycle.inputs import parse_uuid
from jobqueue.models import JobAgent

from ..authentication import AgentTokenAuthentication, ApiKeyAuthentication
from ..parsers import StrictJSONParser
from ..permissions import InWorkspace, WorkspaceKeyOnly
from ..query import query_int
from ..schema import COMMON, WITH_BODY, errors
from ..serializers.job_agents import ClaimResponseSerializer
from ..serializers.shared_instances import represent, validate_input
from ..throttling import CredentialRateThrottle

# Who may call: an agent token (only its own agent and jobs) or the workspace API key; or
# only the key (producer and operator endpoints, the viewsets' default).
AGENT = [InWorkspace]
PRODUCER = [InWorkspace, WorkspaceKeyOnly]
AGENT_TAGS = ["agent"]
PRODUCER_TAGS = ["producer and operator"]

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


def write_schema(tags, operation_id, summary, request, response, *error_statuses):
    """The schema of an operation that takes a JSON body: 200 with `response`, or one of
    `error_statuses`, a bad body (400, 411, 413, 415) or the common errors."""
    return extend_schema(
        tags=tags,
        operation_id=operation_id,
        summary=summary,
        request=request,
        responses={200: response, **errors(*error_statuses, *WITH_BODY, *COMMON)},
    )


class ApiViewSet(ViewSet):
    authentication_classes = [AgentTokenAuthentication, ApiKeyAuthentication]
    permission_classes = PRODUCER  # agent actions say `permission_classes=AGENT`
    throttle_classes = [CredentialRateThrottle]
    parser_classes = [StrictJSONParser]
    # Ids in paths match anything up to the next slash (agents/urls.py), so that a
    # malformed id is answered here, by path_uuid(): a JSON 404, like an unknown id.
    lookup_value_converter = "anyid"
    # The list and detail routes' names, as OPTIONS shows them (WorkspaceRouter).
    route_names: dict[str, str] = {}

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

    def paginated(self, paginator_class, queryset, serializer_class, prepare=None):
        """One page of `queryset` in the paginator's order, rendered by `serializer_class`
        (after prepare(page), when given: what the page's rows share loaded at once)."""
        paginator = paginator_class()
        page = paginator.paginate_queryset(queryset, self.request, self)
        if prepare is not None:
            prepare(page)
        return paginator.get_paginated_response(serializer_class(page, many=True).data)

    def validated(self, serializer_class, data=None):
        return validate_input(serializer_class, self.request.data if data is None else data)


def _has_body(request) -> bool:
    try:
        return int(request.META.get("CONTENT_LENGTH") or 0) > 0
    except ValueError:
        return False


WAIT_PARAM = OpenApiParameter(
    "wait_seconds", OpenApiTypes.INT, required=False,
    description="Hold the request until the job is terminal (successful, failure, cancelled, "
    "expired), at most this many seconds (0 to JOBQUEUE_MAX_CLAIM_WAIT_SECONDS, default 50; "
    "beyond it is a 400); then answer the job as it is.",
)


def wait_param(request) -> int | None:
    """`?wait_seconds=N` as an int from 0 to JOBQUEUE_MAX_CLAIM_WAIT_SECONDS, None when
    absent."""
    return query_int(request, "wait_seconds", 0,
                     jobqueue_settings()["MAX_CLAIM_WAIT_SECONDS"])


def client_gone(request) -> Callable[[], bool] | None:
    """Whether the client of a held request has hung up, where the server tells: gunicorn
    hands its socket to the application (a peek that reads end-of-file: the peer closed)."""
    sock = request.META.get("gunicorn.socket")
    if sock is None:
        return None

    def gone() -> bool:
        try:
            return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True

    return gone


def status_filter(request, default=None):
    value = request.query_params.get("status", default)
    if value is not None and value not in states.ALL:
        raise ValidationError({"status": ["Must be one of: " + ", ".join(sorted(states.ALL))]})
    return value


def claim_body(grant) -> dict:
    return represent(ClaimResponseSerializer, grant)
