"""The PostgreSQL backend: every hot transition is one prepared statement (pg/statements.py)
in its own transaction (autocommit), on one cached cursor per connection (pg/cursor.py),
its rows loaded without Django's per-row overhead (pg/rows.py). Round trips are the main
cost of a transition (docs/performance.md): a job costs two, its claim and its report."""

from __future__ import annotations

import json

from jobqueue import states
from jobqueue.conf import jobqueue_settings
from jobqueue.history import MESSAGE_CHARS
from jobqueue.models import JobEvent

from . import statements as sql
from .cursor import HotCursor
from .rows import columns, jobs_from_rows


class PostgresBackend:
    vendor = "postgresql"

    def __init__(self, db):
        self.db = db
        self.cursor = HotCursor(db)

    def _jobs(self, statement, params, *extra):
        cursor, rows = self.cursor.run(statement, params)
        if not rows:
            return []
        return jobs_from_rows(self.db, columns(self.db, statement, cursor), rows, *extra)

    def claim(self, job_agent, lease: int, limit: int, actor: str, job_id=None, *,
              holder: str = "", expected_attempt: int | None = None,
              idempotency_key: str | None = None):
        """Claim up to `limit` jobs (or the one named, at `expected_attempt` if given):
        (jobs, the database's time)."""
        params = {
            "agent": job_agent.id,
            "limit": limit,  # used by batches past statements.LITERAL_LIMITS only
            "lease": lease,
            "kind": JobEvent.CLAIMED,
            "actor": actor,
            "detail": json.dumps({"lease_seconds": lease}),
            "holder": holder,
            "key": idempotency_key,
        }
        statement = sql.job_claim_up_to(limit)
        if job_id is not None:
            statement, params["job"] = sql.JOB_CLAIM_AVAILABLE_BY_ID, job_id
            if expected_attempt is not None:
                statement = sql.JOB_CLAIM_AVAILABLE_BY_ID_AT_ATTEMPT
                params["expected"] = expected_attempt
        cursor, rows = self.cursor.run(statement, params)
        if not rows:
            return [], None
        names = columns(self.db, statement, cursor)
        jobs = jobs_from_rows(self.db, names, rows, "db_now")
        at = names.index("checkpoint")
        for job, row in zip(jobs, rows, strict=True):
            value = row[at]
            job.claim_checkpoint = json.loads(value) if isinstance(value, str) else value
        return jobs, jobs[0].db_now

    def heartbeat(self, job_id, claim_id, job_agent_id, workspace_id):
        """(new expiry, the database's time) of a renewed claim, or None."""
        params = {"job": job_id, "claim": claim_id, "agent": job_agent_id}
        statement = sql.CLAIM_EXTEND_IF_CURRENT
        if workspace_id is not None:
            statement, params["workspace"] = sql.CLAIM_EXTEND_IF_CURRENT_IN_WORKSPACE, workspace_id
        _cursor, rows = self.cursor.run(statement, params)
        if not rows:
            return None
        tz = self.db.timezone
        return tuple(value.astimezone(tz) for value in rows[0])

    def heartbeat_many(self, claims, job_agent_id, workspace_id):
        """{job_id: new expiry} of the renewed claims, and the database's time (or None)."""
        params = {"jobs": [c[0] for c in claims], "claims": [c[1] for c in claims],
                  "agent": job_agent_id}
        statement = sql.CLAIM_EXTEND_IF_CURRENT_MANY
        if workspace_id is not None:
            statement = sql.CLAIM_EXTEND_IF_CURRENT_MANY_IN_WORKSPACE
            params["workspace"] = workspace_id
        _cursor, rows = self.cursor.run(statement, params)
        tz = self.db.timezone
        renewed = {job_id: expires.astimezone(tz) for job_id, expires, _now in rows}
        return renewed, (rows[0][2].astimezone(tz) if rows else None)

    def report(self, job_id, claim_id, status, actor, *, message, result, external_id,
               job_agent_id, workspace_id, retry=False):
        """The job after a report that its claim allowed, or None (nothing changed)."""
        terminal = status != states.IN_PROGRESS
        params = {
            "job": job_id,
            "claim": claim_id,
            "agent": job_agent_id,
            "workspace": workspace_id,
            "status": status,
            "message": message,
            "result": None if result is None else json.dumps(result),
            "external_id": external_id,
            "kind": JobEvent.STATUS_REPORTED if terminal else JobEvent.PROGRESS_REPORTED,
            "actor": actor,
            "detail": json.dumps({"status": status, "has_result": result is not None,
                                  **({"retry": True} if retry else {}),
                                  **({"message": message[:MESSAGE_CHARS]}
                                     if message and terminal else {})}),
        }
        statement = sql.JOB_SET_STATE_IF_RUNNING if terminal else sql.JOB_SET_PROGRESS_IF_RUNNING
        if retry:
            statement = sql.JOB_FAIL_OR_RETRY_IF_RUNNING
            params.update(_backoff_params())
        cursor, rows = self.cursor.run(statement, params)
        if not rows:
            return None
        if terminal and rows[0][-1] != 1:  # pragma: no cover - would break invariant 2
            raise RuntimeError("report: the claim row changed under the job row's lock")
        (job,) = jobs_from_rows(self.db, columns(self.db, statement, cursor), rows)
        return job

    def report_many(self, items, job_agent_id, workspace_id, actor):
        """{job_id: (status, completed_at)} of the reports that their claims allowed."""
        def column(name, dump=None):
            values = [getattr(r, name) for r in items]
            if all(v is None for v in values):
                return None  # unnest pads a NULL array: "not given" for every report
            return values if dump is None else [None if v is None else dump(v) for v in values]

        params = {
            "jobs": [r.job_id for r in items],
            "claims": [r.claim_id for r in items],
            "statuses": [r.status for r in items],
            "messages": column("message"),
            "results": column("result", json.dumps),
            "external_ids": column("external_id"),
            "retries": [True if r.retry else None for r in items]
            if any(r.retry for r in items) else None,
            **_backoff_params(),
            "agent": job_agent_id,
            "workspace": workspace_id,
            "kind": JobEvent.STATUS_REPORTED,
            "actor": actor,
        }
        _cursor, rows = self.cursor.run(sql.JOB_SET_STATE_IF_RUNNING_MANY, params)
        if rows and rows[0][-1] != len(rows):  # pragma: no cover - would break invariant 2
            raise RuntimeError("batch report: a claim row changed under its job row's lock")
        tz = self.db.timezone
        return {job_id: (status, done and done.astimezone(tz), workspace)
                for job_id, status, done, workspace, _ in rows}


def _backoff_params() -> dict:
    conf = jobqueue_settings()
    return {"backoff": conf["RETRY_BACKOFF_SECONDS"],
            "backoff_cap": conf["MAX_RETRY_BACKOFF_SECONDS"],
            "jitter": float(conf["RETRY_JITTER"])}


__all__ = ["PostgresBackend", "sql"]
