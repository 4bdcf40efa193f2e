"""Which backend runs what differs between the databases: chosen once per database connection
(each thread has its own), by its vendor. Nothing else in the service asks which database it
is on.

A backend has the same methods on each database, takes typed values, and applies the same
guards; the transitions around them (claim.py, lease.py, report.py, checkpoints.py,
effects.py, groups.py, jobqueue.wakeups) are written once:

    claim, heartbeat, heartbeat_many, report, report_many   the hot transitions
    lock_claim_key(job_agent_id, key)      serialize one agent's claims with one idempotency key
    lock_unique_key(workspace_id, key)     serialize one workspace's creates with one unique_key
    lock_effect_ledger(job_id)             serialize the begins of new keys in a job's ledger
    save_checkpoint(job_id, claim_id, data, job_agent_id, workspace_id)   if the claim is current
    hold_group(workspace_id, name)         hold a group's row until commit: (cancelled_at,
                                           finished_at), or None
    hold_claim(job_id, claim_id, job_agent_id, workspace_id)   hold the claim until commit if
                                           current (within its deadline): its attempt, or None
    settle_dependents(ended)               settle the dependents of jobs a transition other
                                           than a report ended (lifecycle/dependencies.py)
    settle_concurrency(workspace_id, key)  give a concurrency key's free slots out now (False:
                                           another transaction holds its lock)
    concurrency_keys_held()                the (workspace_id, key) with held jobs
    settle_rate(workspace_id, key)         give a rate limit key's free permits out now, and
                                           announce it for when its window opens (False:
                                           another transaction holds its lock)
    rate_take_back(workspace_id, key)      a change of a key's limit: its lock, and the
                                           permits its queued jobs were given back
    rate_keys_held()                       the (workspace_id, key) with held jobs
    notify(channel, payloads) / listener(hub)   wake-ups: NOTIFY/LISTEN, or the wake file
    now(), ping()                          the database's clock; a round trip
    reports_announce_ended                 whether the report statements wake the producers
                                           waiting for the jobs they end themselves
    vendor                                 "postgresql" or "sqlite"

PostgreSQL: jobqueue/lifecycle/pg/ (its statements: jobqueue/sql/postgresql.sql). SQLite:
jobqueue/lifecycle/sqlite.py, the portable ORM path (orm.py) and jobqueue/sql/sqlite.sql.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, connections


def backend(alias: str = DEFAULT_DB_ALIAS):
    db = connections[alias]
    chosen = getattr(db, "jobqueue_backend", None)
    if chosen is None:
        chosen = db.jobqueue_backend = _for(db)
    return chosen


def _for(db):
    if db.vendor == "postgresql":
        from .pg import PostgresBackend

        return PostgresBackend(db)
    if db.vendor == "sqlite":
        from .sqlite import SqliteBackend

        return SqliteBackend(db)
    raise ImproperlyConfigured(f"jobqueue runs on PostgreSQL or SQLite, not {db.vendor}.")
