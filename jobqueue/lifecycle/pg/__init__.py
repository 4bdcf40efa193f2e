"""The PostgreSQL backend: every hot transition is one prepared statement (jobqueue/sql/
postgresql.sql) in its own transaction (autocommit), on one cached cursor per connection
(pg/cursor.py), its rows loaded without Django's per-row overhead (pg/rows.py). Round trips
are the main cost of a transition (docs/performance.md): a job costs two, its claim and its
report. The rest of what differs from SQLite is here too: the idempotency key's and the
unique key's advisory locks, the checkpoint's upsert, the group's share lock, LISTEN/NOTIFY
and the clock."""

from __future__ import annotations

import functools
import json

from jobqueue import states
from jobqueue.models import JobEvent
from jobqueue.sql import postgresql as sql
from jobqueue.timeline import MESSAGE_CHARS

from ..clocks import backoff_settings
from .cursor import HotCursor
from .rows import columns, jobs_from_rows

# A batch claim's size is written into its LIMIT, one text per size up to LITERAL_LIMITS (n
# is an int the caller validated, 1..JOBQUEUE_MAX_CLAIM_BATCH). With the limit a parameter,
# PostgreSQL's plan cache cannot price a generic plan (it assumes a tenth of the table): it
# plans the whole statement on every execution (0.3 ms of server time, a quarter of a batch
# claim's cost in a raw loop) or, on a small table, keeps a generic plan that joins the
# UPDATE to a sequential scan of `job`. With the limit in the text the generic plan is the
# index-only one, and the cache keeps it after its first five executions
# (docs/performance.md, "Prepared statements"; tests/integration/core/test_pg_fastpath). The
# reference agent asks for as many jobs as it has free slots, so one connection sees several
# sizes: a text each up to LITERAL_LIMITS (psycopg keeps at most 100 prepared statements a
# connection, evicting the oldest), and the parameter beyond, where a batch that large
# amortizes its planning.
LITERAL_LIMITS = 32


@functools.cache
def claim_statement(limit: int, routed: bool = False) -> str:
    """job_claim_available for a batch of `limit` (1: claim-next); `routed`: an agent with
    labels's, job_claim_available_routed."""
    statement = sql.job_claim_available_routed if routed else sql.job_claim_available
    if limit > LITERAL_LIMITS:
        return statement
    return statement.replace("LIMIT %(limit)s", f"LIMIT {int(limit):d}")


class PostgresBackend:
    vendor = "postgresql"
    # The report statements NOTIFY the producers waiting for the jobs they end themselves.
    reports_announce_ended = True

    def __init__(self, db):
        self.db = db
        self.cursor = HotCursor(db)

    def _one(self, statement: str, params: dict):
        """Run a named statement on Django's cursor (inside the caller's transaction): its
        first row, or None."""
        with self.db.cursor() as cursor:
            cursor.execute(statement, params)
            return cursor.fetchone()

    def now(self):
        """The database's clock."""
        return self._one(sql.clock_now, {})[0]

    def ping(self) -> None:
        self._one(sql.database_ping, {})

    def lock_claim_key(self, job_agent_id, key: str) -> None:
        """Serialize the keyed claims of one agent and key until the caller commits."""
        self._one(sql.claim_key_lock, {"lock": f"jobqueue.claim:{job_agent_id}:{key}"})

    def lock_unique_key(self, workspace_id, key: str) -> None:
        """Serialize the creates of one workspace with one unique_key until the caller
        commits."""
        self._one(sql.unique_key_lock, {"workspace": workspace_id, "key": key})

    def lock_effect_ledger(self, job_id) -> None:
        """Serialize the begins of new keys in the job's effect ledger until the caller
        commits (an advisory lock: no job or claim row)."""
        self._one(sql.effect_ledger_lock, {"job": job_id})

    def save_checkpoint(self, job_id, claim_id, data: str, job_agent_id, workspace_id) -> bool:
        return self._one(sql.checkpoint_save_if_current, {
            "data": data, "job": job_id, "claim": claim_id, "agent": job_agent_id,
            "workspace": workspace_id,
        }) is not None

    def hold_claim(self, job_id, claim_id, job_agent_id, workspace_id) -> int | None:
        """The attempt of `claim_id` if it is the job's current claim within its deadline,
        its row held FOR SHARE until the caller commits; None: not current."""
        row = self._one(sql.claim_hold_if_current, {
            "job": job_id, "claim": claim_id, "agent": job_agent_id, "workspace": workspace_id,
        })
        return None if row is None else row[0]

    def hold_group(self, workspace_id, name: str):
        """(cancelled_at, finished_at) of the group, its row held FOR SHARE until the caller
        commits; None: no such group."""
        return self._one(sql.group_hold, {"workspace": workspace_id, "name": name})

    def settle_dependents(self, ended) -> None:
        """Settle the dependents of the jobs `ended` [(job_id, status)] that have any, in
        the caller's transaction: jobqueue_settle_dependents (migration 0021) for each."""
        self._one(sql.job_settle_dependents, {"jobs": [job_id for job_id, _ in ended],
                                              "statuses": [status for _, status in ended]})

    def settle_concurrency(self, workspace_id, key: str) -> bool:
        """Give the concurrency key's free slots to its held jobs now, in the caller's
        transaction (jobqueue_concurrency_try, migration 0027): False when another
        transaction holds the key's lock (the caller tries again later)."""
        return bool(self._one(sql.concurrency_settle, {"workspace": workspace_id,
                                                       "key": key})[0])

    def settle_rate(self, workspace_id, key: str) -> bool:
        """Give the rate limit key's free permits to its held jobs now, in the caller's
        transaction (jobqueue_rate_try, migration 0029; it announces the key for when its
        window opens): False when another transaction holds the key's lock."""
        return bool(self._one(sql.rate_settle, {"workspace": workspace_id, "key": key})[0])

    def rate_take_back(self, workspace_id, key: str) -> None:
        """A change of the key's limit: take its lock (waiting for it; settle_rate then
        holds it) and the permits its queued jobs were given, in the caller's transaction."""
        params = {"workspace": workspace_id, "key": key}
        self._one(sql.rate_key_lock, params)
        with self.db.cursor() as cursor:
            cursor.execute(sql.rate_take_back, params)

    def rate_keys_held(self) -> list[tuple]:
        """(workspace_id, key) of every rate limit key with held jobs."""
        with self.db.cursor() as cursor:
            cursor.execute(sql.rate_keys_held, {})
            return cursor.fetchall()

    def concurrency_keys_held(self) -> list[tuple]:
        """(workspace_id, key) of every concurrency key with held jobs."""
        with self.db.cursor() as cursor:
            cursor.execute(sql.concurrency_keys_held, {})
            return cursor.fetchall()

    def notify(self, channel: str, payloads: list[str]) -> None:
        """Send the wake-ups, delivered to every listener when the transaction commits."""
        self._one(sql.wake_notify, {"channel": channel, "payloads": payloads})

    def listener(self, hub):
        from jobqueue.wakeups import PgListener

        return PgListener(hub)

    def claim(self, job_agent, lease: int, limit: int, actor: str, job_id=None, *,
              holder: str = "", expected_attempt: int | None = None,
              idempotency_key: str | None = None):
        """Claim up to `limit` jobs (or the one named, at `expected_attempt` if given):
        (jobs, the database's time)."""
        params = {
            "agent": job_agent.id,
            "limit": limit,  # used by batches past LITERAL_LIMITS only
            "lease": lease,
            "kind": JobEvent.CLAIMED,  # the replaced claim's event (the `kept` CTE)
            "actor": actor,
            "holder": holder,
            "key": idempotency_key,
        }
        # An agent without labels is routed no labelled job: its statement reads its own
        # jobs only, and pays nothing for labels.
        statement = claim_statement(limit, bool(job_agent.labels))
        if job_id is not None:
            statement = sql.job_claim_by_id
            params.update(job=job_id, expected=expected_attempt)
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
        statement = sql.claim_extend_if_current
        if workspace_id is not None:
            statement, params["workspace"] = sql.claim_extend_if_current_in_workspace, workspace_id
        _cursor, rows = self.cursor.run(statement, params)
        if not rows:
            return None
        tz = self.db.timezone
        return tuple(value.astimezone(tz) for value in rows[0])

    def heartbeat_many(self, claims, job_agent_id, workspace_id):
        """{job_id: new expiry} of the renewed claims, and the database's time (or None)."""
        params = {"jobs": [c[0] for c in claims], "claims": [c[1] for c in claims],
                  "agent": job_agent_id}
        statement = sql.claim_extend_if_current_many
        if workspace_id is not None:
            statement = sql.claim_extend_if_current_many_in_workspace
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
        statement = sql.job_set_state_if_running if terminal else sql.job_set_progress_if_running
        if retry:
            statement = sql.job_fail_or_retry_if_running
            params.update(backoff_settings())
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
            **backoff_settings(),
            "message_chars": MESSAGE_CHARS,
            "agent": job_agent_id,
            "workspace": workspace_id,
            "kind": JobEvent.STATUS_REPORTED,
            "actor": actor,
        }
        _cursor, rows = self.cursor.run(sql.job_set_state_if_running_many, params)
        if rows and rows[0][-1] != len(rows):  # pragma: no cover - would break invariant 2
            raise RuntimeError("batch report: a claim row changed under its job row's lock")
        tz = self.db.timezone
        return {job_id: (status, done and done.astimezone(tz), workspace)
                for job_id, status, done, workspace, _ in rows}


__all__ = ["LITERAL_LIMITS", "PostgresBackend", "claim_statement"]
