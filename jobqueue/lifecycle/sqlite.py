"""The SQLite backend: the portable ORM path (orm.py) for claims and reports, each heartbeat
as one UPDATE ... RETURNING (the ORM's update() cannot return the new expiry; its statements
are in jobqueue/sql/sqlite.sql), and the rest of what differs from PostgreSQL: writers are
serialized (every write transaction is BEGIN IMMEDIATE, config/settings.py), so a read inside
the caller's transaction stands in for PostgreSQL's row and advisory locks; wake-ups go
through the database's wake file; the clock is SQLite's, in Django's stored format.

UUIDs are stored as 32 hex characters and times as text in Django's format.
"""

from __future__ import annotations

import json
import uuid

from django.db.models import Q
from django.db.models.functions import Now

from jobqueue.db import parse_db_datetime
from jobqueue.models import JobCheckpoint, JobClaim, JobGroup
from jobqueue.sql import sqlite as sql

from .orm import OrmBackend


def _hex(value: uuid.UUID | None) -> str | None:
    return None if value is None else value.hex


class SqliteBackend(OrmBackend):
    vendor = "sqlite"
    # The ORM's reports leave the wake-ups of the producers waiting for their jobs to the
    # caller (lifecycle/report.py).
    reports_announce_ended = False

    def _run(self, statement, params):
        with self.db.cursor() as cursor:
            cursor.execute(statement, params)
            return cursor.fetchall()

    def now(self):
        """The database's clock."""
        return parse_db_datetime(self._run(sql.clock_now, {})[0][0])

    def ping(self) -> None:
        self._run(sql.database_ping, {})

    def lock_claim_key(self, job_agent_id, key: str) -> None:
        """Nothing to lock: the keyed claim's transaction is BEGIN IMMEDIATE already."""

    def lock_unique_key(self, workspace_id, key: str) -> None:
        """Nothing to lock: the create's transaction is BEGIN IMMEDIATE already, so its read
        of the live jobs with the key and its write are one writer's."""

    def lock_effect_ledger(self, job_id) -> None:
        """Nothing to lock: the begin's count and insert are one writer's (the caller's
        transaction holds the write lock)."""

    def save_checkpoint(self, job_id, claim_id, data: str, job_agent_id, workspace_id) -> bool:
        """The read and the write below see and change the same state: the caller's
        transaction holds the write lock."""
        claims = JobClaim.objects.filter(job_id=job_id, claim_id=claim_id)
        if job_agent_id is not None:
            claims = claims.filter(job_agent_id=job_agent_id)
        if workspace_id is not None:
            claims = claims.filter(job__workspace_id=workspace_id)
        attempt = claims.values_list("attempt", flat=True).first()
        if attempt is None:
            return False
        value = json.loads(data)
        updated = JobCheckpoint.objects.filter(job_id=job_id, attempt__lte=attempt).update(
            claim_id=claim_id, attempt=attempt, data=value, saved_at=Now()
        )
        if not updated and not JobCheckpoint.objects.filter(job_id=job_id).exists():
            JobCheckpoint.objects.create(job_id=job_id, claim_id=claim_id, attempt=attempt,
                                         data=value)
        return True

    def hold_claim(self, job_id, claim_id, job_agent_id, workspace_id) -> int | None:
        """The attempt of `claim_id` if it is the job's current claim within its deadline:
        a read is enough, the caller's transaction holds the write lock."""
        claims = JobClaim.objects.filter(
            Q(deadline_at__isnull=True) | Q(deadline_at__gt=Now()), job_id=job_id,
            claim_id=claim_id)
        if job_agent_id is not None:
            claims = claims.filter(job_agent_id=job_agent_id)
        if workspace_id is not None:
            claims = claims.filter(job__workspace_id=workspace_id)
        return claims.values_list("attempt", flat=True).first()

    def hold_group(self, workspace_id, name: str):
        """(cancelled_at, finished_at) of the group, or None: a read is enough, the caller's
        transaction holds the write lock."""
        return JobGroup.objects.filter(workspace_id=workspace_id, name=name).values_list(
            "cancelled_at", "finished_at").first()

    def settle_concurrency(self, workspace_id, key: str) -> bool:
        """Give the key's free slots out now (concurrency_admit; the caller's transaction is
        the writer: no lock to wait for). SQLite's triggers (migration 0027) do the same in
        the transaction that freed a slot; this is for what no status change announces (a
        held-back job that became due, an agent paused or resumed): a paused agent's own
        queued jobs give their slots back first (concurrency_hold_paused)."""
        params = {"workspace": _hex(uuid.UUID(str(workspace_id))), "key": key}
        self._run(sql.concurrency_hold_paused, params)
        self._run(sql.concurrency_admit, params)
        return True

    def settle_rate(self, workspace_id, key: str) -> bool:
        """Give the rate limit key's free permits out now (rate_admit; the caller's
        transaction is the writer). SQLite's triggers (migration 0029) do the same in the
        transaction that changed a job of the key; this is for what no job's change
        announces (its window opened, its limit changed, an agent paused or resumed): the
        permits a claim could not use go back first (rate_hold_paused). When held-back jobs
        remain, the key is announced for when it is to be settled again (rate_window_opens:
        its window opens, or a held-back job becomes due while a permit is free; the wake-up
        hub settles it then, as PostgreSQL's jobqueue_rate_admit announces it)."""
        from jobqueue import wakeups

        params = {"workspace": _hex(uuid.UUID(str(workspace_id))), "key": key}
        self._run(sql.rate_hold_paused, params)
        self._run(sql.rate_admit, params)
        opens = self._run(sql.rate_window_opens, params)
        if opens and opens[0][0] is not None and self._run(sql.rate_keys_held_of, params):
            wakeups.announce(wakeups.rate_key(workspace_id, key), max(0.001, opens[0][0]))
        return True

    def rate_take_back(self, workspace_id, key: str) -> None:
        """A change of the key's limit: the permits its queued jobs were given go back (the
        caller's transaction is the writer)."""
        self._run(sql.rate_take_back, {"workspace": _hex(uuid.UUID(str(workspace_id))),
                                       "key": key})

    def rate_keys_held(self) -> list[tuple]:
        """(workspace_id, key) of every rate limit key with held-back jobs."""
        return [(uuid.UUID(ws), key) for ws, key in self._run(sql.rate_keys_held, {})]

    def concurrency_keys_held(self) -> list[tuple]:
        """(workspace_id, key) of every concurrency key with held-back jobs."""
        return [(uuid.UUID(ws), key) for ws, key in self._run(sql.concurrency_keys_held, {})]

    def notify(self, channel: str, payloads: list[str]) -> None:
        """Append the wake-ups to the wake file once the transaction commits (every process
        of the node reads it)."""
        from jobqueue.wakeups import append_on_commit

        append_on_commit(payloads)

    def listener(self, hub):
        from jobqueue.wakeups import FileListener

        return FileListener(hub)

    def heartbeat(self, job_id, claim_id, job_agent_id, workspace_id):
        """(new expiry, the database's time) of a renewed claim, or None."""
        params = {"job": job_id.hex, "claim": claim_id.hex, "agent": _hex(job_agent_id)}
        statement = sql.claim_extend_if_current
        if workspace_id is not None:
            statement, params["workspace"] = sql.claim_extend_if_current_in_workspace, \
                workspace_id.hex
        rows = self._run(statement, params)
        return tuple(parse_db_datetime(v) for v in rows[0]) if rows else None

    def heartbeat_many(self, claims, job_agent_id, workspace_id):
        """{job_id: new expiry} of the renewed claims, and the database's time (or None)."""
        params = {"agent": job_agent_id.hex,
                  "pairs": json.dumps([[job_id.hex, claim_id.hex] for job_id, claim_id in claims])}
        statement = sql.claim_extend_if_current_many
        if workspace_id is not None:
            statement = sql.claim_extend_if_current_many_in_workspace
            params["workspace"] = workspace_id.hex
        rows = self._run(statement, params)
        renewed = {uuid.UUID(job_id): parse_db_datetime(expires) for job_id, expires, _ in rows}
        return renewed, (parse_db_datetime(rows[0][2]) if rows else None)
