"""The SQLite backend: the portable ORM path (orm.py) for claims and reports, and each
heartbeat as one UPDATE ... RETURNING (the ORM's update() cannot return the new expiry).

UUIDs are stored as 32 hex characters and times as text in Django's format: the clock of
these statements is jobqueue.db.sqlite_clock(), the same text.
"""

from __future__ import annotations

import json
import uuid

from jobqueue.db import parse_db_datetime, sqlite_clock

from .orm import OrmBackend

_NOW = sqlite_clock()
# The lease never runs past the attempt's deadline (MIN() would be NULL without one).
_RENEWED = sqlite_clock("lease_seconds || ' seconds'")
_LEASE_END = f"CASE WHEN deadline_at < {_RENEWED} THEN deadline_at ELSE {_RENEWED} END"
_IN_WORKSPACE = "  AND job_id IN (SELECT id FROM job WHERE workspace_id = %(workspace)s)\n"

# ClaimExtendIfCurrent (as on PostgreSQL): extend the lease if %(claim)s is the job's claim
# and its lease has not expired.
_CLAIM_EXTEND = f"""
UPDATE job_claim SET claim_expires_at = {_LEASE_END}, heartbeat_at = {_NOW}
WHERE job_id = %(job)s AND claim_id = %(claim)s AND claim_expires_at > {_NOW}
  AND (%(agent)s IS NULL OR job_agent_id = %(agent)s)
"""
_CLAIM_EXTENDED = f"RETURNING claim_expires_at, {_NOW}\n"
CLAIM_EXTEND_IF_CURRENT = _CLAIM_EXTEND + _CLAIM_EXTENDED
CLAIM_EXTEND_IF_CURRENT_IN_WORKSPACE = _CLAIM_EXTEND + _IN_WORKSPACE + _CLAIM_EXTENDED

# ClaimExtendIfCurrentMany: the agent's current, unexpired claims among %(pairs)s, a JSON
# list of [job_id, claim_id]. Writers are serialized: no lock order to keep.
_CLAIM_EXTEND_MANY = f"""
UPDATE job_claim SET claim_expires_at = {_LEASE_END}, heartbeat_at = {_NOW}
WHERE job_agent_id = %(agent)s AND claim_expires_at > {_NOW}
  AND (job_id, claim_id) IN (
      SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(%(pairs)s))
"""
_CLAIMS_EXTENDED = f"RETURNING job_id, claim_expires_at, {_NOW}\n"
CLAIM_EXTEND_IF_CURRENT_MANY = _CLAIM_EXTEND_MANY + _CLAIMS_EXTENDED
CLAIM_EXTEND_IF_CURRENT_MANY_IN_WORKSPACE = _CLAIM_EXTEND_MANY + _IN_WORKSPACE + _CLAIMS_EXTENDED


def _hex(value: uuid.UUID | None) -> str | None:
    return None if value is None else value.hex


class SqliteBackend(OrmBackend):
    vendor = "sqlite"

    def _run(self, statement, params):
        with self.db.cursor() as cursor:
            cursor.execute(statement, params)
            return cursor.fetchall()

    def heartbeat(self, job_id, claim_id, job_agent_id, workspace_id):
        """(new expiry, the database's time) of a renewed claim, or None."""
        params = {"job": job_id.hex, "claim": claim_id.hex, "agent": _hex(job_agent_id)}
        statement = CLAIM_EXTEND_IF_CURRENT
        if workspace_id is not None:
            statement, params["workspace"] = CLAIM_EXTEND_IF_CURRENT_IN_WORKSPACE, workspace_id.hex
        rows = self._run(statement, params)
        return tuple(parse_db_datetime(v) for v in rows[0]) if rows else None

    def heartbeat_many(self, claims, job_agent_id, workspace_id):
        """{job_id: new expiry} of the renewed claims, and the database's time (or None)."""
        params = {"agent": job_agent_id.hex,
                  "pairs": json.dumps([[job_id.hex, claim_id.hex] for job_id, claim_id in claims])}
        statement = CLAIM_EXTEND_IF_CURRENT_MANY
        if workspace_id is not None:
            statement = CLAIM_EXTEND_IF_CURRENT_MANY_IN_WORKSPACE
            params["workspace"] = workspace_id.hex
        rows = self._run(statement, params)
        renewed = {uuid.UUID(job_id): parse_db_datetime(expires) for job_id, expires, _ in rows}
        return renewed, (parse_db_datetime(rows[0][2]) if rows else None)
