"""The jobqueue client library and the reference pull agent, `jobqueue-agent` (see cli.py).

- `AgentClient` (client.py): the agent's side of the API (claim, heartbeat, report, release,
  logs and artifacts of its claims), with an agent token; its effect ledger
  (`effect()`, `run_effect()`: docs/effects.md).
- `ProducerClient` (producer.py): the producer's side (create jobs, get and wait for them,
  cancel, requeue, list, groups, logs and artifacts), with a workspace API key.
- `verify_fencing_token` (fencing.py): a claim's fencing token verified offline, and the
  fenced store (fenced_store.py), the worked example of a resource that refuses stale
  attempts; both need the `fencing` extra (pip install 'jobqueue-client[fencing]').

Every error the server answers is an `ApiError` subclass carrying its stable `code` (errors.py).
Nothing in this package imports Django or `jobqueue`: it runs on providers' machines and talks
to the service only over the HTTP API.
"""

from .client import AgentClient, Effect
from .errors import (
    ApiError,
    AuthError,
    Conflict,
    EffectAlreadyCommitted,
    EffectNotBegun,
    InvalidRequest,
    LeaseLost,
    NotClaimable,
    NotFound,
    ServerError,
    Throttled,
    TransportError,
)
from .fencing import (
    FencingClaims,
    FencingTokenError,
    FencingUnavailable,
    fetch_jwks,
    verify_fencing_token,
)
from .producer import (
    ChecksumMismatch,
    GroupCancelled,
    IdempotencyKeyReused,
    InvalidTransition,
    JobFinished,
    LogChunk,
    ProducerClient,
    UniqueKeyConflict,
    WaitTimeout,
)
from .version import USER_AGENT, __version__

__all__ = [
    "AgentClient", "ApiError", "AuthError", "ChecksumMismatch", "Conflict", "FencingClaims",
    "FencingTokenError", "FencingUnavailable", "GroupCancelled", "IdempotencyKeyReused",
    "InvalidRequest", "InvalidTransition", "JobFinished", "LeaseLost", "LogChunk",
    "NotClaimable", "NotFound", "ProducerClient", "ServerError", "Throttled", "TransportError",
    "USER_AGENT", "WaitTimeout", "__version__", "fetch_jwks", "verify_fencing_token",
]
__all__ += ["UniqueKeyConflict"]
# The effect ledger (docs/effects.md; a job's child uses it through `jobqueue-effect`).
__all__ += ["Effect", "EffectAlreadyCommitted", "EffectNotBegun"]
