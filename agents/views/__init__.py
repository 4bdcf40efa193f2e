"""The HTTP API, one viewset per resource, routed under /v1/workspaces/{workspace_id}/ by
agents/urls.py. Each action validates its input, calls one lifecycle function, renders.

Agent actions accept an agent token (its own agent and jobs only) or the workspace API key;
the others need the key.
"""

from .effects import JobEffectViewSet
from .explain import JobExplainViewSet
from .fairness import FairnessKeyViewSet
from .flows import FlowViewSet
from .groups import GroupViewSet
from .job_agents import JobAgentViewSet
from .jobs import JobViewSet
from .outputs import JobOutputViewSet
from .ratelimits import RateLimitViewSet
from .registration import RegisterView, RegistrationTokenViewSet
from .schedules import ScheduleViewSet
from .tokens import TokenViewSet
from .webhooks import WebhookViewSet

__all__ = ["FairnessKeyViewSet", "FlowViewSet", "GroupViewSet", "JobAgentViewSet",
           "JobEffectViewSet", "JobExplainViewSet", "JobOutputViewSet", "JobViewSet",
           "RateLimitViewSet", "RegisterView", "RegistrationTokenViewSet", "ScheduleViewSet",
           "TokenViewSet", "WebhookViewSet"]
