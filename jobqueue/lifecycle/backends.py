"""Which backend runs a transition's statements: chosen once per database connection (each
thread has its own), by its vendor.

A backend has the same methods on each database (claim, heartbeat, heartbeat_many, report,
report_many), takes typed values, and applies the same guards; the transitions around them
(claim.py, lease.py, report.py) are written once.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, connections


def backend():
    db = connections[DEFAULT_DB_ALIAS]
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
