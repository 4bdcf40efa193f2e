"""The job queue's settings. DEFAULTS is the one place each default is written:
config/settings.py reads every JOBQUEUE value from its environment variable (JOBQUEUE_<name>)
with this default, and jobqueue_settings() is settings.JOBQUEUE over DEFAULTS (a project
that sets only part of JOBQUEUE gets the rest from here)."""

from django.conf import settings

DEFAULTS = {
    "DEFAULT_LEASE_SECONDS": 60,
    "MIN_LEASE_SECONDS": 5,
    "MAX_LEASE_SECONDS": 3600,
    "DEFAULT_MAX_ATTEMPTS": 3,
    "MIN_MAX_ATTEMPTS": 1,
    "MAX_MAX_ATTEMPTS": 100,
    "HEARTBEAT_DIVISOR": 3,
    "REAPER_BATCH_SIZE": 500,
    "REAPER_INTERVAL_SECONDS": 5.0,
    "REAPER_STALE_AFTER_SECONDS": 300,
    "MAX_CLAIM_BATCH": 100,
    "MAX_HEARTBEAT_BATCH": 500,
    "MAX_REPORT_BATCH": 500,
    "MAX_RETRY_AFTER_SECONDS": 86400,
    "MAX_CLAIM_WAIT_SECONDS": 50,
    "MAX_WAITING_CLAIMS": 200,
    "WARM_WAITS": 4,
    "WAIT_RECHECK_SECONDS": 2.0,
    "WAKE_FILE_POLL_SECONDS": 0.02,
    "LISTEN_DATABASE_URL": "",
    # A group's cancel: how many jobs each of its transactions cancels.
    "GROUP_CANCEL_BATCH": 500,
    # Largest checkpoint (its JSON text, in bytes) a heartbeat or progress report may carry.
    "MAX_CHECKPOINT_BYTES": 64 * 1024,
    "RETRY_BACKOFF_SECONDS": 10,
    "MAX_RETRY_BACKOFF_SECONDS": 3600,
    "RETRY_JITTER": 0.0,
    "MIN_MAX_RUNTIME_SECONDS": 1,
    "MAX_MAX_RUNTIME_SECONDS": 7 * 86400,
    "MAX_EXPIRES_IN_SECONDS": 10**8,
    "MAX_LOG_BYTES": 16 * 1024 * 1024,
    "LOG_GRACE_SECONDS": 30,
    "MAX_ARTIFACT_BYTES": 100 * 1024 * 1024,
    "MAX_ATTEMPT_ARTIFACT_BYTES": 1024**3,
    "MAX_ARTIFACTS_PER_ATTEMPT": 100,
    "MAX_MESSAGE_BYTES": 64 * 1024,
    "MAX_RESULT_BYTES": 1024 * 1024,
    "MAX_EFFECTS_PER_JOB": 1000,  # a job's effect ledger: entries (docs/effects.md)
    # Retention (prune_jobs): days a finished job is kept; 0 keeps it forever.
    "RETENTION_DAYS": 14,  # successful and cancelled
    "RETENTION_FAILED_DAYS": 30,  # failure and expired
    "PRUNE_BATCH_SIZE": 1000,
    "PRUNE_INTERVAL_SECONDS": 300.0,
    "ARTIFACT_CLEAN_INTERVAL_SECONDS": 300.0,
    "ARTIFACT_CLEAN_BATCH_SIZE": 500,
    # The group watcher (maintenance/group_watcher.py): group.finished.
    "GROUP_WATCH_INTERVAL_SECONDS": 5.0,
    "GROUP_WATCH_BATCH_SIZE": 500,
    # Schedules (maintenance/schedules.py): how often maintenance fires the due ones, and how
    # many schedules one transaction takes.
    "SCHEDULE_INTERVAL_SECONDS": 5.0,
    "SCHEDULE_BATCH_SIZE": 100,
    # Webhooks (maintenance/webhooks.py).
    "WEBHOOK_MAX_ATTEMPTS": 12,
    "WEBHOOK_BACKOFF_SECONDS": 5.0,
    "WEBHOOK_MAX_BACKOFF_SECONDS": 3600.0,
    "WEBHOOK_TIMEOUT_SECONDS": 10.0,
    "WEBHOOK_LEASE_SECONDS": 60,
    "WEBHOOK_BATCH_SIZE": 50,
    "WEBHOOK_INTERVAL_SECONDS": 1.0,
    "WEBHOOK_RESPONSE_BYTES": 4096,
    "WEBHOOK_ALLOWED_NETWORKS": "",
    "WEBHOOK_CONCURRENCY": 8,
    "MAX_WEBHOOKS_PER_WORKSPACE": 20,
    # The HTTP edge: the largest request body (bytes); presence (agents/health.py writes it,
    # jobqueue/presence.py defines online): how often at most a token's requests write its
    # last_used_at and its agent's last_seen_at (seconds, per token, whatever the number of
    # processes), and how recently an agent must have been seen to be online.
    "MAX_REQUEST_BYTES": 1024 * 1024,
    "AGENT_SEEN_WRITE_SECONDS": 60.0,
    "AGENT_ONLINE_SECONDS": 120.0,
    "PREPARED_STATEMENTS": True,
    # Fencing tokens (jobqueue/fencing.py): key files (none: var/fencing_key.pem), `iss`.
    "FENCING_KEY_FILES": [],
    "FENCING_ISSUER": "jobqueue",
    "JWKS_MAX_AGE_SECONDS": 300,
    # The oldest jobqueue-client (major.minor) the API supports; older ones are logged.
    "MIN_CLIENT_VERSION": "0.2",
    # /metrics: the keys of each kind given series of their own (concurrency and rate limit
    # keys: the most held back first; fairness keys: the most queued; 0: none),
    # jobqueue/keystats.py.
    "METRICS_TOP_KEYS": 20,
}


def jobqueue_settings() -> dict:
    """settings.JOBQUEUE over the defaults (read each call so tests can override)."""
    return {**DEFAULTS, **getattr(settings, "JOBQUEUE", {})}
