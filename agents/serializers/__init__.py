"""Request validation and response shapes of the HTTP API (docs/api.md), one module per
resource as agents/views/ has one viewset per resource:

- `jobs`: a job as its producer sees it, the create body, the claim holder's writes
  (heartbeat, status, release) and its claim's state;
- `job_agents`: the agent and its health, its poll, its claims (ClaimedJobSerializer is the
  one shape carrying `dispatch_context`), the batch heartbeat and report;
- `outputs` (the log's and artifacts' answers), `effects` (the effect ledger), `groups`,
  `tokens`, `registration`, `webhooks`, `schedules`, `ratelimits`, `fairness`: theirs;
  `explain`: why a job is not running.

Beside them, `fields` holds the building blocks (the strict field types, ApiInput, the
bodies several resources take, page_of) and `shared_instances` the one bound instance per
shape that renders and validates the hot endpoints (represent(), validate_input()).

The views import from those modules. The names are re-exported here for convenience (tests,
scripts, and code written against the single module this package was). vocabulary() lives
here because it needs every request shape, so every module.
"""

from __future__ import annotations

from .effects import (
    RESULT_HELP,
    EffectAnswerSerializer,
    EffectBeginInput,
    EffectCommitInput,
    EffectListSerializer,
    EffectSerializer,
)
from .explain import ExplainAgentsSerializer, ExplainReasonSerializer, ExplanationSerializer
from .fairness import FairnessKeyPage, FairnessKeySerializer, FairnessWeightInput
from .fields import (
    INT32_MAX,
    MAX_UNKNOWN_NAMED,
    ApiInput,
    EmptyInput,
    LabelField,
    ReasonInput,
    StrictBooleanField,
    StrictCharField,
    StrictChoiceField,
    StrictIntegerField,
    StrictUUIDField,
    labels_field,
    page_of,
)
from .groups import GroupCancelSerializer, GroupSerializer
from .job_agents import (
    HOLDER_HELP,
    LIST_ITEM_FIELDS,
    REFUSAL_CODES,
    REPORT_REFUSAL_CODES,
    BatchClaimResponseSerializer,
    BatchHeartbeatInput,
    BatchHeartbeatItem,
    BatchHeartbeatOutcome,
    BatchHeartbeatResponse,
    BatchReportInput,
    BatchReportItem,
    BatchReportOutcome,
    BatchReportResponse,
    ClaimedJobSerializer,
    ClaimInfoSerializer,
    ClaimInput,
    ClaimNextInput,
    ClaimResponseSerializer,
    HealthSerializer,
    JobAgentCreateInput,
    JobAgentPage,
    JobAgentSerializer,
    JobAgentUpdateInput,
    JobListItemPage,
    JobListItemSerializer,
    Outcome,
    ParentSerializer,
    batch_of,
)
from .jobs import (
    CHECKPOINT_HELP,
    JOB_LIST_ONLY,
    AttemptSerializer,
    ClaimCheckSerializer,
    ClaimStateSerializer,
    DispatchContextField,
    EventSerializer,
    FlowCreatedSerializer,
    FlowCreateInput,
    FlowJobInput,
    HeartbeatInput,
    HeartbeatResponseSerializer,
    JobAgentConfigField,
    JobCreatedSerializer,
    JobCreateInput,
    JobDetailSerializer,
    JobPage,
    JobSerializer,
    JobSummarySerializer,
    ReleaseInput,
    StatusInput,
)
from .outputs import ArtifactListSerializer, ArtifactSerializer, LogAppendSerializer
from .ratelimits import RateLimitInput, RateLimitPage, RateLimitSerializer
from .registration import (
    MAX_REGISTRATION_EXPIRES_IN_SECONDS,
    MAX_REGISTRATION_USES,
    AgentSettingsSerializer,
    RegisteredAgentSerializer,
    RegisteredSerializer,
    RegisterInput,
    RegistrationTokenCreateInput,
    RegistrationTokenIssuedSerializer,
    RegistrationTokenPage,
    RegistrationTokenSerializer,
)
from .schedules import (
    ScheduleCreateInput,
    ScheduleFiresSerializer,
    ScheduleJobInput,
    ScheduleJobSerializer,
    SchedulePage,
    ScheduleSerializer,
    ScheduleUpdateInput,
)
from .shared_instances import represent, validate_input
from .tokens import (
    DEFAULT_OVERLAP_SECONDS,
    MAX_OVERLAP_SECONDS,
    MAX_TOKEN_TTL_SECONDS,
    TokenCreateInput,
    TokenListItemSerializer,
    TokenPage,
    TokenRotatedSerializer,
    TokenRotateInput,
    TokenSerializer,
)
from .webhooks import (
    WebhookCreatedSerializer,
    WebhookCreateInput,
    WebhookDeliveryPage,
    WebhookDeliverySerializer,
    WebhookPage,
    WebhookSerializer,
    WebhookUrlField,
)

__all__ = [
    "CHECKPOINT_HELP", "HOLDER_HELP", "INT32_MAX", "JOB_LIST_ONLY", "LIST_ITEM_FIELDS",
    "DEFAULT_OVERLAP_SECONDS", "MAX_OVERLAP_SECONDS", "MAX_TOKEN_TTL_SECONDS",
    "MAX_UNKNOWN_NAMED", "REFUSAL_CODES", "REPORT_REFUSAL_CODES", "RESULT_HELP", "ApiInput",
    "ArtifactListSerializer", "ArtifactSerializer", "AttemptSerializer",
    "BatchClaimResponseSerializer", "BatchHeartbeatInput", "BatchHeartbeatItem",
    "BatchHeartbeatOutcome", "BatchHeartbeatResponse", "BatchReportInput", "BatchReportItem",
    "BatchReportOutcome", "BatchReportResponse", "ClaimCheckSerializer", "ClaimInfoSerializer",
    "ClaimInput", "ClaimNextInput", "ClaimResponseSerializer", "ClaimStateSerializer",
    "ClaimedJobSerializer", "DispatchContextField", "EffectAnswerSerializer",
    "EffectBeginInput", "EffectCommitInput", "EffectListSerializer", "EffectSerializer",
    "EmptyInput", "EventSerializer", "FlowCreateInput", "FlowCreatedSerializer",
    "FlowJobInput", "GroupCancelSerializer", "GroupSerializer",
    "HealthSerializer", "HeartbeatInput", "HeartbeatResponseSerializer", "JobAgentConfigField",
    "JobAgentCreateInput", "JobAgentPage", "JobAgentSerializer", "JobAgentUpdateInput",
    "JobCreateInput",
    "JobCreatedSerializer",
    "JobDetailSerializer", "JobListItemPage", "JobListItemSerializer", "JobPage",
    "JobSerializer", "JobSummarySerializer", "LogAppendSerializer", "Outcome",
    "ParentSerializer", "ReasonInput",
    "ReleaseInput", "ScheduleCreateInput", "ScheduleFiresSerializer", "ScheduleJobInput",
    "ScheduleJobSerializer", "SchedulePage",
    "ScheduleSerializer", "ScheduleUpdateInput", "StatusInput", "StrictBooleanField",
    "StrictCharField",
    "StrictChoiceField", "StrictIntegerField", "StrictUUIDField", "TokenCreateInput",
    "TokenListItemSerializer", "TokenPage", "TokenRotateInput", "TokenRotatedSerializer",
    "TokenSerializer", "WebhookCreateInput",
    "WebhookCreatedSerializer", "WebhookDeliveryPage",
    "WebhookDeliverySerializer", "WebhookPage", "WebhookSerializer", "WebhookUrlField",
    "batch_of", "page_of", "represent", "validate_input", "vocabulary",
    "LabelField", "labels_field", "MAX_REGISTRATION_EXPIRES_IN_SECONDS", "MAX_REGISTRATION_USES",
    "AgentSettingsSerializer", "RegisteredAgentSerializer", "RegisteredSerializer",
    "RegisterInput", "RegistrationTokenCreateInput", "RegistrationTokenIssuedSerializer",
    "RegistrationTokenPage", "RegistrationTokenSerializer",
    "ExplainAgentsSerializer", "ExplainReasonSerializer", "ExplanationSerializer",
    "RateLimitInput", "RateLimitPage", "RateLimitSerializer",
    "FairnessKeyPage", "FairnessKeySerializer", "FairnessWeightInput",
]


def vocabulary() -> frozenset[str]:
    """The API's own words in request bodies: every field name of every request shape and
    every value a choice field allows. No secret; an error may say them (agents/exceptions.py
    does not count them as quoting the body). Every module of this package is imported
    above, so every request shape is an ApiInput subclass by now."""
    words: set[str] = set()
    shapes, seen = [ApiInput], set()
    while shapes:
        shape = shapes.pop()
        shapes.extend(shape.__subclasses__())
        if shape in seen:
            continue
        seen.add(shape)
        fields = list(shape().fields.items())
        while fields:
            name, field = fields.pop()
            words.add(name)
            words.update(str(choice) for choice in getattr(field, "choices", {}))
            child = getattr(field, "child", None)
            if child is not None:
                fields.append((name, child))
    return frozenset(word.lower() for word in words)
