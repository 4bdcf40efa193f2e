"""The job lifecycle: the only code that moves a job between statuses.

One function per transition, each in the module that names it:

    create.py    create_job_agent, update_job_agent, create_job, dispatch_job
    flows.py     create_flow: a graph of jobs with their dependencies, in one transaction
    claim.py     claim_job (a named job), claim_next (the next ones, SKIP LOCKED, waiting
                 or not; claim_next_job / claim_next_jobs / claim_next_waiting are its
                 shorthands), wait_for_job_end (a producer's wait);
                 the waits themselves are jobqueue.wakeups
    lease.py     heartbeat, heartbeat_many, release_job
    report.py    report_status, report_many
    operator.py  cancel_job, requeue_job, mark_failed (one skeleton, three Transitions)
    pause.py     pause_job_agent, resume_job_agent (claims hand out nothing while paused)
    reconcile.py claim_state (read-only: is a claim_id current, and if not, why)
    groups.py    group_state, cancel_group (bounded batches), hold_group (create, requeue),
                 mark_finished_groups (the group watcher: group.finished)
    reap.py      reap_expired_claims_once, expire_overdue_jobs_once, count_expired_claims
                 (jobqueue.maintenance.reaper sweeps them)
    logs.py      append_log, read_log, log_tails: each attempt's log (docs/outputs.md), and
                 LogSlice.redacted_text: a tail as the admin shows it (jobqueue.redaction)
    effects.py   begin_effect, commit_effect, effects_of: the job's effect ledger (what its
                 attempts did outside the service, at most once; docs/effects.md)
    schedules.py create_schedule, update_schedule (pause, resume), trigger_schedule,
                 delete_schedule, next_fire_times, fire_due_schedules (maintenance's
                 `schedules` service: each fire time once; the cron is jobqueue.cron)
    artifacts.py upload_artifact, publish (the ORM report's), published_artifacts,
                 published_artifact, open_artifact, clean_artifacts: files staged per
                 claim, published by its successful report

and what they share:

    inputs.py    typed input values (ClaimRef, ReportItem) and one validator per rule
    refusals.py  explain_refusal: why a write with a claim_id changed nothing (every path)
    dependencies.py  what a job that ends does to its dependents (settle), a create's
                 parents (hold_parents), the parents a claim and a job show
    finished.py  announce_finished: the webhook outbox rows (in the transition's transaction)
                 and jobqueue.signals.job_finished on commit, once per job a transition
                 ended (every path that ends jobs calls it)
    prune.py     retention's batch: finished jobs and every row that refers to them
    results.py   what they answer (ClaimGrant, HeartbeatResult, outcomes of batches)
    records.py   jobs in a caller's scope, job events
    clocks.py    the clock rules of an attempt (deadline, lease end, retry backoff)
    backends.py  the backend, chosen once per connection by its vendor: everything that
                 differs between the databases (the hot transitions, locks, wake-ups, clock)
      pg/          PostgreSQL: its statements are jobqueue/sql/postgresql.sql (whole, named);
                   cursor.py (the cached, preparing psycopg cursor), rows.py (row loading)
      sqlite.py    SQLite: the portable ORM path (orm.py) and jobqueue/sql/sqlite.sql

Which job a claim may take, and in which order, is jobqueue/claimrule.py: the ORM claim, the
wake-up re-check and the PostgreSQL statements all follow it.

Every transition puts its guards (status, claim_id, expiry) in the WHERE of the statement
that writes, checks the row count, and appends a JobEvent in the same transaction; every time
comes from the database's clock. Callers pass typed values (the edge parses, inputs.py
checks the domain's rules); refusals raise jobqueue.exceptions.

Lock order, to stay free of deadlocks on PostgreSQL: a transaction that touches both tables
locks the `job` row first and the `job_claim` row second. Heartbeats lock only claim rows;
the reaper takes job rows with SKIP LOCKED, so it never waits on a report in flight; batches
lock in job_id order.

SQLite runs every write transaction as BEGIN IMMEDIATE (config/settings.py), so writers are
serialized; the same conditional updates and row counts keep the rules there.
"""

from jobqueue.actors import agent_actor

from .claim import (
    claim_job,
    claim_next,
    claim_next_job,
    claim_next_jobs,
    claim_next_waiting,
    heartbeat_interval_for,
    lease_for,
    wait_for_job_end,
)
from .create import create_job, create_job_agent, dispatch_job, label_set, update_job_agent
from .flows import FlowJob, create_flow
from .groups import cancel_group, group_state, mark_finished_groups
from .inputs import BATCH_REPORT_STATUSES, ClaimRef, ReportItem
from .inputs import lease_seconds as validate_lease_seconds
from .inputs import max_attempts as validate_max_attempts
from .inputs import max_runtime_seconds as validate_max_runtime_seconds
from .inputs import wait_seconds as validate_wait_seconds
from .lease import heartbeat, heartbeat_many, release_job
from .operator import cancel_job, mark_failed, requeue_job
from .orm import claim_candidates
from .pause import is_paused, pause_job_agent, resume_job_agent
from .reap import count_expired_claims, expire_overdue_jobs_once, reap_expired_claims_once
from .reconcile import claim_state
from .report import report_many, report_status
from .results import (
    BatchHeartbeatResult,
    BatchReportResult,
    ClaimCheck,
    ClaimGrant,
    GroupState,
    HeartbeatOutcome,
    HeartbeatResult,
    ReapResult,
    ReportOutcome,
)

__all__ = [
    "BATCH_REPORT_STATUSES",
    "BatchHeartbeatResult",
    "BatchReportResult",
    "ClaimCheck",
    "ClaimGrant",
    "GroupState",
    "ClaimRef",
    "FlowJob",
    "HeartbeatOutcome",
    "HeartbeatResult",
    "ReapResult",
    "ReportItem",
    "ReportOutcome",
    "agent_actor",
    "cancel_group",
    "mark_finished_groups",
    "cancel_job",
    "claim_candidates",
    "claim_job",
    "claim_next",
    "claim_next_job",
    "claim_next_jobs",
    "claim_next_waiting",
    "claim_state",
    "count_expired_claims",
    "create_flow",
    "create_job",
    "create_job_agent",
    "label_set",
    "update_job_agent",
    "dispatch_job",
    "expire_overdue_jobs_once",
    "group_state",
    "heartbeat",
    "heartbeat_interval_for",
    "heartbeat_many",
    "is_paused",
    "lease_for",
    "mark_failed",
    "pause_job_agent",
    "reap_expired_claims_once",
    "release_job",
    "report_many",
    "report_status",
    "requeue_job",
    "resume_job_agent",
    "validate_lease_seconds",
    "validate_max_attempts",
    "validate_wait_seconds",
    "wait_for_job_end",
    "validate_max_runtime_seconds",
]
