"""The domain's errors. Each has a stable `code`; the HTTP edge maps them in one place."""


class JobQueueError(Exception):
    code = "jobqueue_error"
    default_detail = "Job queue error."

    def __init__(self, detail: str | None = None, **context):
        self.detail = detail or self.default_detail
        self.context = context
        super().__init__(self.detail)


class NotFound(JobQueueError):
    code = "not_found"
    default_detail = "Not found."


class InvalidInput(JobQueueError):
    """Input the lifecycle refuses before touching anything (bounds, unknown status)."""

    code = "validation_error"
    default_detail = "Invalid input."


class Conflict(JobQueueError):
    """A transition refused because of the job's or the claim's current state."""


class JobNotClaimable(Conflict):
    code = "job_not_claimable"
    default_detail = "The job is not queued and due, or another agent claimed it first."


class AgentNameTaken(Conflict):
    code = "agent_name_taken"
    default_detail = "A job agent of this workspace has this name already."


class AgentPaused(Conflict):
    code = "agent_paused"
    default_detail = "The job agent is paused: its claims hand out nothing until it is resumed."


class ClaimSuperseded(Conflict):
    code = "claim_superseded"
    default_detail = (
        "This claim is no longer current: it was reaped, released, requeued or reclaimed."
    )


class LeaseExpired(Conflict):
    code = "lease_expired"
    default_detail = "The lease of this claim has expired; a heartbeat cannot revive it."


class DeadlineExceeded(Conflict):
    code = "deadline_exceeded"
    default_detail = (
        "A clock ended this attempt: the job's max_runtime_seconds or its expires_at passed."
    )


class JobCancelled(Conflict):
    code = "job_cancelled"
    default_detail = "The job was cancelled."


class JobFinished(Conflict):
    code = "job_finished"
    default_detail = "The job has already reached a terminal status."


class InvalidTransition(Conflict):
    code = "invalid_transition"
    default_detail = "This transition is not allowed from the job's current status."


class IdempotencyKeyReused(JobQueueError):
    code = "idempotency_key_reused"
    default_detail = "This Idempotency-Key was already used with a different request body."


class GroupCancelled(Conflict):
    code = "group_cancelled"
    default_detail = "The job's group was cancelled; it takes no new jobs and no requeues."


class UniqueKeyConflict(Conflict):
    """A create with on_conflict replace or debounce_seconds whose unique_key met a live job
    of another job agent: it may not change that job (context: `job_id`, the live job's)."""

    code = "unique_key_conflict"
    default_detail = (
        "The live job with this unique_key belongs to another job agent; a replace or a "
        "debounce changes only a job of the create's own agent."
    )


class WebhookLimitReached(Conflict):
    """The workspace already has JOBQUEUE_MAX_WEBHOOKS_PER_WORKSPACE webhook endpoints."""

    code = "webhook_limit_reached"
    default_detail = "The workspace has as many webhook endpoints as it may have; delete one first."


class LogRangeGap(JobQueueError):
    """A log chunk that starts past the log's end: the agent resends from `length`."""

    code = "log_range_gap"
    default_detail = "The chunk starts past the end of the log; resend from its length."

    @property
    def length(self) -> int:
        return self.context["length"]


class OutputTooLarge(JobQueueError):
    """A log or artifact over its cap: nothing of it is kept."""

    code = "output_too_large"
    default_detail = "This output is over its size cap."


class EffectNotBegun(Conflict):
    code = "effect_not_begun"
    default_detail = (
        "This attempt has not begun this effect: POST .../effects/{key}/begin first (its answer "
        "says whether an earlier attempt began or committed it)."
    )


class EffectAlreadyCommitted(Conflict):
    code = "effect_already_committed"
    default_detail = "This effect's outcome is recorded already, with another result."
