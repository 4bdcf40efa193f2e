"""Job statuses, in one place. Each comment names what moves a job out of that status.

The invariants the statuses keep are listed, numbered, in docs/architecture.md ("Invariants");
the one code names most, invariant 2: a job is IN_PROGRESS if and only if it has exactly one
JobClaim row (every path out of IN_PROGRESS deletes the row in the same transaction)."""

PENDING = "pending"  # held by its producer; dispatch_job() makes it queued.
QUEUED = "queued"  # claimable once available_at <= now(); claim_job()/claim_next_jobs().
IN_PROGRESS = "in_progress"  # has exactly one JobClaim; report/release/reap/cancel/requeue.
SUCCESSFUL = "successful"  # terminal; only an operator requeue moves it.
FAILURE = "failure"  # terminal; only an operator requeue moves it.
CANCELLED = "cancelled"  # terminal; only an operator requeue moves it.
EXPIRED = "expired"  # terminal: the reaper found its lease expired on the last attempt.

CHOICES = [
    (PENDING, "Pending"),
    (QUEUED, "Queued"),
    (IN_PROGRESS, "In progress"),
    (SUCCESSFUL, "Successful"),
    (FAILURE, "Failure"),
    (CANCELLED, "Cancelled"),
    (EXPIRED, "Expired"),
]
ALL = frozenset(value for value, _ in CHOICES)
TERMINAL = frozenset({SUCCESSFUL, FAILURE, CANCELLED, EXPIRED})
ACTIVE = frozenset({PENDING, QUEUED, IN_PROGRESS})
# What an agent may report with PUT .../status.
REPORTABLE = frozenset({IN_PROGRESS, SUCCESSFUL, FAILURE, CANCELLED})
