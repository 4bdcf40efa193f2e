"""The job lifecycle: the only code that moves a job between statuses.

One function per transition. Each puts its guards (status, claim_id, expiry) in the WHERE of
the statement that writes, checks the row count, and appends a JobEvent in the same
transaction. Every time comes from the database's clock.

Lock order, to stay free of deadlocks on PostgreSQL: a transaction that touches both tables
locks the `job` row first and the `job_claim` row second. Heartbeats lock only the claim row;
the reaper takes job rows with SKIP LOCKED, so it never waits on a report in flight.

SQLite runs every write transaction as BEGIN IMMEDIATE (see config/settings.py), so writers
are serialized; the same conditional updates and row counts keep the rules there.

On PostgreSQL the hot paths are one statement each (round trips are their main cost, see
docs/performance.md): a claim (named, next or batch) and a status report are each a single
CTE statement in its own transaction with the same guards in the WHERE of its UPDATE, and the
same lock order (the report's UPDATE locks the job row; the claim row is deleted from the
rows it returns). A batch heartbeat locks its claim rows in job_id order, as the reaper does.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import uuid
from dataclasses import dataclass

from django.db import DEFAULT_DB_ALIAS, IntegrityError, connection, connections, transaction
from django.db.models import Case, DateTimeField, F, Q, UUIDField, Value, When
from django.db.models.base import ModelState
from django.db.models.functions import Now

from . import observe, states
from .conf import jobqueue_settings
from .exceptions import (
    ClaimSuperseded,
    IdempotencyKeyReused,
    InvalidInput,
    InvalidTransition,
    JobCancelled,
    JobFinished,
    JobNotClaimable,
    LeaseExpired,
    NotFound,
)
from .models import Job, JobAgent, JobClaim, JobEvent

# --- results -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ClaimGrant:
    """What a successful claim hands to the agent (and only to it)."""

    job: Job
    claim_id: uuid.UUID
    attempt: int
    lease_seconds: int
    claimed_at: dt.datetime
    claim_expires_at: dt.datetime
    heartbeat_interval_seconds: int
    server_time: dt.datetime


@dataclass(frozen=True)
class HeartbeatResult:
    job_id: uuid.UUID
    claim_expires_at: dt.datetime
    server_time: dt.datetime


@dataclass(frozen=True)
class ReapResult:
    requeued: int = 0
    expired: int = 0
    batches: int = 0

    @property
    def reaped(self) -> int:
        return self.requeued + self.expired


# --- helpers -----------------------------------------------------------------------------


def agent_actor(job_agent_id) -> str:
    return f"agent:{job_agent_id}"


def _scoped_jobs(workspace_id=None, job_agent_id=None):
    qs = Job.objects.all()
    if workspace_id is not None:
        qs = qs.filter(workspace_id=workspace_id)
    if job_agent_id is not None:
        qs = qs.filter(job_agent_id=job_agent_id)
    return qs


def _fetch_job(job_id, *, workspace_id=None, job_agent_id=None) -> Job:
    try:
        return _scoped_jobs(workspace_id, job_agent_id).get(id=job_id)
    except (Job.DoesNotExist, ValueError, TypeError) as exc:
        raise NotFound("No such job.") from exc


def _event(job_id, kind, *, attempt=0, actor="", claim_id=None, **detail) -> JobEvent:
    return JobEvent(
        job_id=job_id, kind=kind, attempt=attempt, actor=actor, claim_id=claim_id, detail=detail
    )


def _db_now() -> dt.datetime:
    from .db import db_now

    return db_now()


def lease_for(job_agent: JobAgent) -> int:
    conf = jobqueue_settings()
    lease = job_agent.effective_lease_seconds
    return max(conf["MIN_LEASE_SECONDS"], min(conf["MAX_LEASE_SECONDS"], int(lease)))


def heartbeat_interval_for(lease_seconds: int) -> int:
    return max(1, lease_seconds // max(1, jobqueue_settings()["HEARTBEAT_DIVISOR"]))


def validate_lease_seconds(value) -> int | None:
    if value is None:
        return None
    conf = jobqueue_settings()
    if not isinstance(value, int) or isinstance(value, bool) or not (
        conf["MIN_LEASE_SECONDS"] <= value <= conf["MAX_LEASE_SECONDS"]
    ):
        raise InvalidInput(
            f"lease_seconds must be an integer from {conf['MIN_LEASE_SECONDS']} "
            f"to {conf['MAX_LEASE_SECONDS']}.",
            field="lease_seconds",
        )
    return value


def validate_max_attempts(value) -> int | None:
    if value is None:
        return None
    conf = jobqueue_settings()
    if not isinstance(value, int) or isinstance(value, bool) or not (
        conf["MIN_MAX_ATTEMPTS"] <= value <= conf["MAX_MAX_ATTEMPTS"]
    ):
        raise InvalidInput(
            f"max_attempts must be an integer from {conf['MIN_MAX_ATTEMPTS']} "
            f"to {conf['MAX_MAX_ATTEMPTS']}.",
            field="max_attempts",
        )
    return value


# --- agents ------------------------------------------------------------------------------


def create_job_agent(*, workspace, name: str, lease_seconds=None, max_attempts=None) -> JobAgent:
    name = (name or "").strip()
    if not name:
        raise InvalidInput("name must not be empty.", field="name")
    agent = JobAgent(
        workspace=workspace,
        name=name,
        lease_seconds=validate_lease_seconds(lease_seconds),
        max_attempts=validate_max_attempts(max_attempts),
    )
    try:
        with transaction.atomic():
            agent.save()
    except IntegrityError as exc:
        raise InvalidInput("A job agent with this name already exists.", field="name") from exc
    return agent


# --- create and dispatch -----------------------------------------------------------------


def _fingerprint(payload: dict) -> str:
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def create_job(
    *,
    workspace,
    job_agent: JobAgent,
    job_agent_config: dict | None = None,
    dispatch_context: dict | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    delay_seconds: int | None = None,
    external_id: str = "",
    idempotency_key: str | None = None,
    hold: bool = False,
    actor: str = "",
) -> tuple[Job, bool]:
    """Create a job (queued, or pending when `hold`). Returns (job, created).

    With an idempotency key, a replay of the same request returns the first job and
    created=False; the same key with different content raises IdempotencyKeyReused.
    """
    if job_agent.workspace_id != workspace.id:
        raise NotFound("No such job agent.")
    max_attempts = validate_max_attempts(max_attempts) or job_agent.effective_max_attempts
    if delay_seconds is not None and (
        not isinstance(delay_seconds, int) or delay_seconds < 0 or delay_seconds > 10**8
    ):
        raise InvalidInput("delay_seconds must be a non-negative integer.", field="delay_seconds")
    fingerprint = ""
    if idempotency_key is not None:
        if (
            not idempotency_key
            or len(idempotency_key) > 255
            or not idempotency_key.isprintable()
        ):
            raise InvalidInput(
                "Idempotency-Key must be 1 to 255 printable characters.",
                field="idempotency_key",
            )
        fingerprint = _fingerprint(
            {
                "job_agent": str(job_agent.id),
                "job_agent_config": job_agent_config or {},
                "dispatch_context": dispatch_context or {},
                "priority": priority,
                "max_attempts": max_attempts,
                "delay_seconds": delay_seconds,
                "external_id": external_id,
                "hold": hold,
            }
        )
        existing = Job.objects.filter(workspace=workspace, idempotency_key=idempotency_key).first()
        if existing is not None:
            return _idempotent_replay(existing, fingerprint), False

    job = Job(
        workspace=workspace,
        job_agent=job_agent,
        status=states.PENDING if hold else states.QUEUED,
        job_agent_config=job_agent_config or {},
        dispatch_context=dispatch_context or {},
        priority=priority,
        max_attempts=max_attempts,
        initial_max_attempts=max_attempts,
        external_id=external_id or "",
        idempotency_key=idempotency_key,
        idempotency_fingerprint=fingerprint,
    )
    if delay_seconds:
        from .db import NowPlusSeconds

        job.available_at = NowPlusSeconds(delay_seconds)
    try:
        with transaction.atomic():
            job.save(force_insert=True)
            _event(job.id, JobEvent.CREATED, actor=actor, status=job.status).save()
    except IntegrityError:
        if idempotency_key is None:
            raise
        existing = Job.objects.filter(workspace=workspace, idempotency_key=idempotency_key).first()
        if existing is None:
            raise
        return _idempotent_replay(existing, fingerprint), False
    if delay_seconds:
        job.refresh_from_db(fields=["available_at"])
    observe.emit("created", job_agent_id=job_agent.id)
    return job, True


def _idempotent_replay(existing: Job, fingerprint: str) -> Job:
    if existing.idempotency_fingerprint != fingerprint:
        raise IdempotencyKeyReused()
    return existing


def dispatch_job(job_id, *, workspace_id=None, actor: str = "") -> Job:
    """pending -> queued (the producer releases its hold)."""
    with transaction.atomic():
        n = (
            _scoped_jobs(workspace_id)
            .filter(id=job_id, status=states.PENDING)
            .update(status=states.QUEUED, available_at=Now(), updated_at=Now())
        )
        if n == 1:
            job = Job.objects.get(id=job_id)
            _event(job.id, JobEvent.DISPATCHED, attempt=job.attempt, actor=actor).save()
            return job
    job = _fetch_job(job_id, workspace_id=workspace_id)
    raise InvalidTransition(f"Only a pending job can be dispatched; this one is {job.status}.")


# --- claim -------------------------------------------------------------------------------


def claim_candidates(job_agent: JobAgent, candidates=None):
    """The locking query of a claim on SQLite (PostgreSQL runs the same SELECT inside
    _PG_CLAIM_SQL): this agent's claimable jobs in claim order, SKIP LOCKED, with the
    database's clock alongside. Served by job_claim_order_idx."""
    qs = Job.objects.all() if candidates is None else candidates
    return (
        qs.filter(job_agent_id=job_agent.id)
        .claimable()
        .in_claim_order()
        .annotate(db_now=Now())
        .select_for_update(skip_locked=True, of=("self",))
    )


def _claim(job_agent: JobAgent, candidates, limit: int) -> list[ClaimGrant]:
    """Lock up to `limit` claimable candidates and claim them. Caller holds atomic()."""
    locked = list(claim_candidates(job_agent, candidates)[:limit])
    if not locked:
        return []
    now = locked[0].db_now
    lease = lease_for(job_agent)
    expires = now + dt.timedelta(seconds=lease)
    actor = agent_actor(job_agent.id)
    claim_ids = {job.id: uuid.uuid4() for job in locked}
    # The rows are locked (PostgreSQL) or the database is write-locked (SQLite), so these
    # values are current; the guard still goes in the WHERE of the one write for the batch.
    last_claim_id = (
        Value(claim_ids[locked[0].id])
        if len(locked) == 1
        else Case(
            *(When(id=job_id, then=Value(cid)) for job_id, cid in claim_ids.items()),
            output_field=UUIDField(),
        )
    )
    n = Job.objects.filter(id__in=list(claim_ids), status=states.QUEUED).update(
        status=states.IN_PROGRESS,
        attempt=F("attempt") + 1,
        last_claim_id=last_claim_id,
        started_at=now,
        updated_at=now,
    )
    if n != len(locked):  # pragma: no cover - impossible while the locks are held
        raise JobNotClaimable()
    claims, events = [], []
    for job in locked:
        claim_id = claim_ids[job.id]
        job.status = states.IN_PROGRESS
        job.attempt += 1
        job.last_claim_id = claim_id
        job.started_at = now
        job.updated_at = now
        claims.append(
            JobClaim(
                job_id=job.id,
                job_agent_id=job_agent.id,
                claim_id=claim_id,
                attempt=job.attempt,
                lease_seconds=lease,
                claimed_at=now,
                claim_expires_at=expires,
            )
        )
        events.append(
            _event(
                job.id,
                JobEvent.CLAIMED,
                attempt=job.attempt,
                actor=actor,
                claim_id=claim_id,
                lease_seconds=lease,
            )
        )
    JobClaim.objects.bulk_create(claims)
    JobEvent.objects.bulk_create(events)
    return _grants(locked, lease, now)


def _grants(jobs: list[Job], lease: int, now: dt.datetime) -> list[ClaimGrant]:
    """What a claim returns for jobs just claimed at the database time `now`."""
    expires = now + dt.timedelta(seconds=lease)
    interval = heartbeat_interval_for(lease)
    return [
        ClaimGrant(
            job=job,
            claim_id=job.last_claim_id,
            attempt=job.attempt,
            lease_seconds=lease,
            claimed_at=now,
            claim_expires_at=expires,
            heartbeat_interval_seconds=interval,
            server_time=now,
        )
        for job in jobs
    ]


# PostgreSQL: the whole claim is one statement (one round trip, its own transaction). The
# same query as claim_candidates() locks the candidates in claim order with SKIP LOCKED; a
# MATERIALIZED CTE evaluates it exactly once (never `IN (SELECT ... LIMIT n FOR UPDATE)`).
# Then the guarded UPDATE (status still 'queued'), the claim rows and the events, all from
# the rows that UPDATE returned. Lock order: job rows; the claim rows are new. FOR NO KEY
# UPDATE (the UPDATE's own lock): a foreign-key check's KEY SHARE does not make it skip a job.
# The job's columns by name, never `job.*`: these statements are prepared once per
# connection, and a prepared `RETURNING job.*` fails ("cached plan must not change result
# type") on every connection after a migration adds a column to `job`.
_JOB_COLUMNS = ", ".join(f'job."{f.column}"' for f in Job._meta.concrete_fields)

_PG_CLAIM_SQL = """
WITH locked AS MATERIALIZED (
    SELECT id FROM job
    WHERE job_agent_id = %(agent)s AND status = 'queued'
      AND available_at <= STATEMENT_TIMESTAMP() {only}
    ORDER BY priority DESC, available_at, created_at
    LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
), claimed AS (
    UPDATE job SET status = 'in_progress', attempt = job.attempt + 1,
        last_claim_id = gen_random_uuid(), started_at = STATEMENT_TIMESTAMP(),
        updated_at = STATEMENT_TIMESTAMP()
    FROM locked WHERE job.id = locked.id AND job.status = 'queued'
    RETURNING {job_columns}
), claims AS (
    INSERT INTO job_claim (job_id, job_agent_id, claim_id, attempt, lease_seconds, claimed_at,
                           claim_expires_at)
    SELECT id, job_agent_id, last_claim_id, attempt, %(lease)s, STATEMENT_TIMESTAMP(),
           STATEMENT_TIMESTAMP() + make_interval(secs => %(lease)s)
    FROM claimed
), events AS (
    INSERT INTO job_event (job_id, kind, attempt, actor, claim_id, detail, created_at)
    SELECT id, %(kind)s, attempt, %(actor)s, last_claim_id, %(detail)s::jsonb,
           STATEMENT_TIMESTAMP()
    FROM claimed
)
SELECT claimed.*, STATEMENT_TIMESTAMP() AS db_now FROM claimed
ORDER BY priority DESC, available_at, created_at
"""


_PG_CLAIM_SQL_NEXT = _PG_CLAIM_SQL.format(only="", job_columns=_JOB_COLUMNS)
_PG_CLAIM_SQL_NAMED = _PG_CLAIM_SQL.format(only="AND id = %(job)s", job_columns=_JOB_COLUMNS)


def _claim_pg(db, job_agent: JobAgent, limit: int, job_id: uuid.UUID | None = None):
    lease = lease_for(job_agent)
    params = {
        "agent": job_agent.id,
        "limit": limit,
        "lease": lease,
        "kind": JobEvent.CLAIMED,
        "actor": agent_actor(job_agent.id),
        "detail": json.dumps({"lease_seconds": lease}),
    }
    sql = _PG_CLAIM_SQL_NEXT
    if job_id is not None:
        sql = _PG_CLAIM_SQL_NAMED
        params["job"] = job_id
    jobs = _jobs_from_rows(db, *_pg_run(db, sql, params), "db_now")
    if not jobs:
        return []
    return _grants(jobs, lease, jobs[0].db_now)


_preparing_cursor_class = None


def _preparing_cursor(conn):
    """A psycopg cursor with server-side binding whose statements are prepared."""
    global _preparing_cursor_class
    if _preparing_cursor_class is None:
        from django.db.backends.postgresql.base import ServerBindingCursor

        class PreparingCursor(ServerBindingCursor):
            def execute(self, query, params=None, *, prepare=None, binary=None):
                prepare = True if prepare is None else prepare
                return super().execute(query, params, prepare=prepare, binary=binary)

        _preparing_cursor_class = PreparingCursor
    return _preparing_cursor_class(conn)


def _new_hot_cursor(db):
    from psycopg.types.datetime import TimestamptzLoader

    raw_conn = db.connection
    if raw_conn.prepare_threshold is None:
        # Django turns psycopg's automatic preparing off (None), which also ignores an
        # explicit prepare=True. A threshold never reached keeps it off for every other
        # query and lets these statements be prepared.
        raw_conn.prepare_threshold = 2**31 - 1
    cur = _preparing_cursor(raw_conn)
    # psycopg's own timestamptz loader (its C version) instead of Django's pure-Python
    # subclass: it yields the session's time zone, which Django keeps equal to
    # db.timezone; _jobs_from_rows() then sets db.timezone's tzinfo as Django's would.
    cur.adapters.register_loader("timestamptz", TimestamptzLoader)
    return cur


def _hot_cursor(db):
    """This connection's cursor for the hot statements, created once per psycopg connection
    (a connection opened after a drop gets a new one)."""
    cached = getattr(db, "_jobqueue_hot_cursor", None)
    if cached is not None and cached[0] is db.connection and not cached[1].closed:
        return cached[1]
    cur = _new_hot_cursor(db)
    db._jobqueue_hot_cursor = (db.connection, cur)
    return cur


def _pg_run(db, sql: str, params: dict) -> tuple[tuple[str, ...], list[tuple]]:
    """One statement on PostgreSQL with server-side parameter binding, prepared once per
    connection (the SQL text never varies with the values). A claim or report then skips
    parsing and planning its CTE: about a sixth of its cost (docs/performance.md).

    The hot path skips Django's cursor wrapper (a new cursor and a column description per
    call were a tenth of a claim's client time) but keeps what db.cursor() and the wrapper
    guard: the health check, errors wrapped as django.db errors, the broken-transaction
    check. While queries are logged
    or wrapped (DEBUG, CaptureQueriesContext, execute_wrapper) it goes through the wrapper."""
    db.close_if_health_check_failed()  # as db.cursor() does (CONN_HEALTH_CHECKS)
    db.ensure_connection()
    if db.queries_logged or db.execute_wrappers:
        with db.wrap_database_errors:
            raw = _new_hot_cursor(db)
        with db._prepare_cursor(raw) as cursor:
            cursor.execute(sql, params)
            return _columns(db, sql, cursor), cursor.fetchall()
    db.validate_no_broken_transaction()
    with db.wrap_database_errors:
        cur = _hot_cursor(db)
        cur.execute(sql, params)
        return _columns(db, sql, cur), cur.fetchall()


_COLUMNS: dict = {}  # (alias, sql) -> the statement's column names (its text names them)


def _columns(db, sql, cursor) -> tuple[str, ...]:
    key = (db.alias, sql)
    names = _COLUMNS.get(key)
    if names is None:
        names = _COLUMNS[key] = tuple(col.name for col in cursor.description)
    return names


_ROW_LAYOUTS: dict = {}  # (alias, columns, extra) -> where each field is and its converters


def _jobs_from_rows(db, columns, rows: list[tuple], *extra: str) -> list[Job]:
    """Job instances (with the fields' own converters) from rows naming the job's columns;
    each name in `extra` becomes an attribute of the instance."""
    key = (db.alias, columns, extra)
    cached = _ROW_LAYOUTS.get(key)
    if cached is None:
        plain, times, converted = [], [], []
        for f in Job._meta.concrete_fields:
            converters = f.get_db_converters(db)
            at = columns.index(f.column)
            if converters:
                converted.append((f.attname, at, converters, f.cached_col))
            elif isinstance(f, DateTimeField):
                times.append((f.attname, at))
            else:
                plain.append((f.attname, at))
        times += [(name, columns.index(name)) for name in extra]  # extras are times (db_now)
        cached = _ROW_LAYOUTS[key] = (plain, times, converted)
    plain, times, converted = cached
    tz = db.timezone
    jobs = []
    for row in rows:
        values = {name: row[at] for name, at in plain}
        for name, at in times:
            value = row[at]
            values[name] = None if value is None else value.astimezone(tz)
        for name, at, converters, col in converted:
            value = row[at]
            for convert in converters:
                value = convert(value, col, db)
            values[name] = value
        jobs.append(_loaded_job(db.alias, values))
    return jobs


def _loaded_job(alias: str, values: dict) -> Job:
    """A Job as Model.from_db() builds it from a full row, minus the per-field setattr loop
    and the pre_init/post_init signals (no receiver in this project listens to Job)."""
    job = Job.__new__(Job)
    job.__dict__.update(values)
    state = ModelState()
    state.adding = False
    state.db = alias
    job._state = state
    return job


def claim_job(job_agent: JobAgent, job_id) -> ClaimGrant:
    """Claim the named job for this agent: at most once, whoever races for it."""
    try:
        job_uuid = uuid.UUID(str(job_id))
    except ValueError as exc:
        raise NotFound("No such job.") from exc
    db = connections[DEFAULT_DB_ALIAS]
    if db.vendor == "postgresql":
        grants = _claim_pg(db, job_agent, 1, job_id=job_uuid)
    else:
        with transaction.atomic():
            grants = _claim(job_agent, Job.objects.filter(id=job_uuid), 1)
    if grants:
        observe.emit("claimed", job_agent_id=job_agent.id, count=1)
        return grants[0]
    # Tell "not yours / not there" (404) from "not claimable now" (409).
    _fetch_job(job_uuid, job_agent_id=job_agent.id)
    raise JobNotClaimable()


def claim_next_jobs(job_agent: JobAgent, limit: int = 1) -> list[ClaimGrant]:
    """Claim up to `limit` of this agent's claimable jobs, in claim order (SKIP LOCKED)."""
    max_batch = jobqueue_settings()["MAX_CLAIM_BATCH"]
    if not isinstance(limit, int) or isinstance(limit, bool) or not (1 <= limit <= max_batch):
        raise InvalidInput(f"limit must be an integer from 1 to {max_batch}.", field="limit")
    db = connections[DEFAULT_DB_ALIAS]
    if db.vendor == "postgresql":
        grants = _claim_pg(db, job_agent, limit)
    else:
        with transaction.atomic():
            grants = _claim(job_agent, Job.objects.all(), limit)
    if grants:
        observe.emit("claimed", job_agent_id=job_agent.id, count=len(grants))
    return grants


def claim_next_job(job_agent: JobAgent) -> ClaimGrant | None:
    grants = claim_next_jobs(job_agent, 1)
    return grants[0] if grants else None


# --- refusals ----------------------------------------------------------------------------


def _refuse(job_id, claim_id, operation: str, *, workspace_id=None, job_agent_id=None,
            heartbeat: bool = False, actor: str = ""):
    """Explain why a write carrying `claim_id` changed nothing, record it, and raise."""
    job = _fetch_job(job_id, workspace_id=workspace_id, job_agent_id=job_agent_id)
    if job.status == states.CANCELLED:
        exc = JobCancelled()
    elif job.status in states.TERMINAL:
        exc = JobFinished()
    elif heartbeat and JobClaim.objects.filter(
        job_id=job.id, claim_id=claim_id, claim_expires_at__lte=Now()
    ).exists():
        exc = LeaseExpired()
    else:
        exc = ClaimSuperseded()
    _event(
        job.id,
        JobEvent.STALE_WRITE_REFUSED,
        attempt=job.attempt,
        actor=actor,
        claim_id=claim_id,
        operation=operation,
        code=exc.code,
    ).save()
    observe.emit("refused", operation=operation, code=exc.code)
    raise exc


def _as_uuid(value, field="claim_id") -> uuid.UUID:
    try:
        return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))
    except (ValueError, TypeError, AttributeError) as exc:
        raise InvalidInput(f"{field} must be a UUID.", field=field) from exc


# --- heartbeat ---------------------------------------------------------------------------

# SQLite's now() and now() + the claim's lease, in the text format Django stores datetimes
# in (so that comparisons with stored values stay correct).
_SQLITE_NOW = "STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')"
_SQLITE_LEASE_END = "STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW', lease_seconds || ' seconds')"

_HEARTBEAT_SQL = {
    "postgresql": (
        "UPDATE job_claim SET claim_expires_at = STATEMENT_TIMESTAMP() "
        "+ make_interval(secs => lease_seconds), heartbeat_at = STATEMENT_TIMESTAMP() "
        "WHERE job_id = %s AND claim_id = %s AND claim_expires_at > STATEMENT_TIMESTAMP() "
        "{scope}RETURNING claim_expires_at, STATEMENT_TIMESTAMP()"
    ),
    "sqlite": (
        "UPDATE job_claim SET claim_expires_at = " + _SQLITE_LEASE_END + ", "
        "heartbeat_at = " + _SQLITE_NOW + " "
        "WHERE job_id = %s AND claim_id = %s AND claim_expires_at > " + _SQLITE_NOW + " "
        "{scope}RETURNING claim_expires_at, " + _SQLITE_NOW
    ),
}


def heartbeat(job_id, claim_id, *, job_agent_id=None, workspace_id=None) -> HeartbeatResult:
    """Extend the lease to now() + lease_seconds. Writes only job_claim, one statement.

    Refused (and nothing written) unless claim_id is current and its lease has not expired:
    a heartbeat never revives an expired lease, even before the reaper runs.
    """
    claim_uuid = _as_uuid(claim_id)
    try:
        job_uuid = uuid.UUID(str(job_id))
    except ValueError as exc:
        raise NotFound("No such job.") from exc
    vendor = connection.vendor
    params = [_db_uuid(job_uuid), _db_uuid(claim_uuid)]
    scope = ""
    if job_agent_id is not None:
        scope = "AND job_agent_id = %s "
        params.append(_db_uuid(_as_uuid(job_agent_id, "job_agent_id")))
    if workspace_id is not None:
        scope += "AND job_id IN (SELECT id FROM job WHERE workspace_id = %s) "
        params.append(_db_uuid(_as_uuid(workspace_id, "workspace_id")))
    sql = _HEARTBEAT_SQL["postgresql" if vendor == "postgresql" else "sqlite"].format(scope=scope)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        _refuse(
            job_uuid,
            claim_uuid,
            "heartbeat",
            workspace_id=workspace_id,
            job_agent_id=job_agent_id,
            heartbeat=True,
            actor=agent_actor(job_agent_id) if job_agent_id else "",
        )
    expires, now = (_parse_db_datetime(v) for v in row)
    observe.emit("heartbeat", job_agent_id=job_agent_id)
    return HeartbeatResult(job_id=job_uuid, claim_expires_at=expires, server_time=now)


def _db_uuid(value: uuid.UUID):
    # Django stores UUIDs as char(32) hex on SQLite and as uuid on PostgreSQL.
    return value if connection.vendor == "postgresql" else value.hex


def _parse_db_datetime(value) -> dt.datetime:
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    return dt.datetime.fromisoformat(value).replace(tzinfo=dt.UTC)


# --- batch heartbeat -----------------------------------------------------------------------


@dataclass(frozen=True)
class HeartbeatOutcome:
    """One claim's answer in a batch heartbeat: renewed with its new expiry, or why not."""

    job_id: uuid.UUID
    renewed: bool
    claim_expires_at: dt.datetime | None = None
    code: str | None = None


@dataclass(frozen=True)
class BatchHeartbeatResult:
    server_time: dt.datetime
    results: list[HeartbeatOutcome]


# Lock the live claims in job_id order (the reaper locks claims in the same order), then
# renew them; every guard is repeated in the WHERE of the UPDATE. Touches only job_claim.
_HEARTBEAT_MANY_SQL_PG = (
    "WITH req(job_id, claim_id) AS (SELECT * FROM unnest(%s::uuid[], %s::uuid[])), "
    "locked AS (SELECT c.job_id FROM job_claim c JOIN req ON req.job_id = c.job_id "
    "AND req.claim_id = c.claim_id WHERE c.job_agent_id = %s "
    "AND c.claim_expires_at > STATEMENT_TIMESTAMP() {scope}"
    "ORDER BY c.job_id FOR UPDATE OF c) "
    "UPDATE job_claim c SET claim_expires_at = STATEMENT_TIMESTAMP() "
    "+ make_interval(secs => c.lease_seconds), heartbeat_at = STATEMENT_TIMESTAMP() "
    "FROM locked, req WHERE c.job_id = locked.job_id AND req.job_id = c.job_id "
    "AND req.claim_id = c.claim_id AND c.job_agent_id = %s "
    "AND c.claim_expires_at > STATEMENT_TIMESTAMP() {scope}"
    "RETURNING c.job_id, c.claim_expires_at, STATEMENT_TIMESTAMP()"
)
_HEARTBEAT_MANY_SQL_SQLITE = (
    "UPDATE job_claim SET claim_expires_at = " + _SQLITE_LEASE_END + ", "
    "heartbeat_at = " + _SQLITE_NOW + " "
    "WHERE job_agent_id = %s AND claim_expires_at > " + _SQLITE_NOW + " "
    "AND (job_id, claim_id) IN (VALUES {pairs}) {scope}"
    "RETURNING job_id, claim_expires_at, " + _SQLITE_NOW
)


def _parse_heartbeat_batch(claims) -> list[tuple[uuid.UUID, uuid.UUID]]:
    limit = jobqueue_settings()["MAX_HEARTBEAT_BATCH"]
    if not isinstance(claims, (list, tuple)) or not 1 <= len(claims) <= limit:
        raise InvalidInput(f"claims must be a list of 1 to {limit} items.", field="claims")
    pairs, seen = [], set()
    for item in claims:
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            raise InvalidInput("each claim must be a (job_id, claim_id) pair.", field="claims")
        job_id = _as_uuid(item[0], "job_id")
        claim_id = _as_uuid(item[1], "claim_id")
        if job_id in seen:
            raise InvalidInput("each job_id may appear only once in claims.", field="claims")
        seen.add(job_id)
        pairs.append((job_id, claim_id))
    return pairs


def heartbeat_many(job_agent_id, claims, *, workspace_id=None) -> BatchHeartbeatResult:
    """Renew many claims of one agent at once: `claims` is [(job_id, claim_id), ...].

    One statement renews every claim that is current and unexpired (the single heartbeat's
    guards, in the WHERE) and writes only job_claim. Each other claim is answered with
    why not: lease_expired, claim_superseded, job_cancelled, job_finished or not_found (no
    such job for this agent). Results keep the order of `claims`. Bad input (not a list,
    too many items, a malformed UUID, a job twice) raises InvalidInput and changes nothing.
    """
    pairs = _parse_heartbeat_batch(claims)
    agent_uuid = _as_uuid(job_agent_id, "job_agent_id")
    ws_uuid = _as_uuid(workspace_id, "workspace_id") if workspace_id is not None else None
    renewed: dict[uuid.UUID, dt.datetime] = {}
    server_time = None
    # Autocommit: the one statement is its own transaction, so the claim locks are held
    # only while it runs, not while the refusals are explained.
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            scope = "AND c.job_id IN (SELECT id FROM job WHERE workspace_id = %s) "
            scope = scope if ws_uuid else ""
            sql = _HEARTBEAT_MANY_SQL_PG.format(scope=scope)
            head = [[p[0] for p in pairs], [p[1] for p in pairs], agent_uuid]
            params = head + ([ws_uuid] if ws_uuid else []) + [agent_uuid]
            params += [ws_uuid] if ws_uuid else []
        else:
            scope = "AND job_id IN (SELECT id FROM job WHERE workspace_id = %s) " if ws_uuid else ""
            sql = _HEARTBEAT_MANY_SQL_SQLITE.format(
                pairs=", ".join(["(%s, %s)"] * len(pairs)), scope=scope
            )
            params = [agent_uuid.hex]
            for job_id, claim_id in pairs:
                params += [job_id.hex, claim_id.hex]
            params += [ws_uuid.hex] if ws_uuid else []
        cursor.execute(sql, params)
        for job_id, expires, now in cursor.fetchall():
            job_uuid = job_id if isinstance(job_id, uuid.UUID) else uuid.UUID(job_id)
            renewed[job_uuid] = _parse_db_datetime(expires)
            server_time = _parse_db_datetime(now)
    refused = [p for p in pairs if p[0] not in renewed]
    codes = _explain_heartbeat_refusals(refused, agent_uuid, ws_uuid) if refused else {}
    if server_time is None:
        server_time = _db_now()
    results = []
    for job_id, _claim_id in pairs:
        if job_id in renewed:
            results.append(HeartbeatOutcome(job_id, True, claim_expires_at=renewed[job_id]))
        else:
            results.append(HeartbeatOutcome(job_id, False, code=codes[job_id]))
    if renewed:
        observe.emit("heartbeat", job_agent_id=agent_uuid, count=len(renewed))
    for code in codes.values():
        observe.emit("refused", operation="heartbeat", code=code)
    return BatchHeartbeatResult(server_time=server_time, results=results)


def _explain_heartbeat_refusals(refused, agent_uuid, ws_uuid) -> dict[uuid.UUID, str]:
    """Why each claim was not renewed (the single heartbeat's rules), and record it."""
    claim_of = dict(refused)
    jobs = _scoped_jobs(ws_uuid, agent_uuid).filter(id__in=list(claim_of))
    rows = {
        row["id"]: row
        for row in jobs.annotate(db_now=Now()).values(
            "id", "status", "attempt", "claim__claim_id", "claim__claim_expires_at", "db_now"
        )
    }
    codes, events = {}, []
    actor = agent_actor(agent_uuid)
    for job_id, claim_id in refused:
        row = rows.get(job_id)
        if row is None:
            codes[job_id] = NotFound.code
            continue
        if row["status"] == states.CANCELLED:
            code = JobCancelled.code
        elif row["status"] in states.TERMINAL:
            code = JobFinished.code
        elif row["claim__claim_id"] == claim_id and (
            _parse_db_datetime(row["claim__claim_expires_at"])
            <= _parse_db_datetime(row["db_now"])
        ):
            code = LeaseExpired.code
        else:
            code = ClaimSuperseded.code
        codes[job_id] = code
        events.append(
            _event(
                job_id,
                JobEvent.STALE_WRITE_REFUSED,
                attempt=row["attempt"],
                actor=actor,
                claim_id=claim_id,
                operation="heartbeat",
                code=code,
            )
        )
    if events:
        JobEvent.objects.bulk_create(events)
    return codes


# --- status reports and release ------------------------------------------------------------


def report_status(
    job_id,
    claim_id,
    status: str,
    *,
    message: str | None = None,
    result=None,
    external_id: str | None = None,
    job_agent_id=None,
    workspace_id=None,
) -> Job:
    """Record progress (status in_progress) or end the job (a terminal status).

    Accepted with the current claim_id, even after the lease's expiry, as long as the reaper
    has not taken the claim. A retried identical terminal report returns the same job.
    """
    claim_uuid = _as_uuid(claim_id)
    if status not in states.REPORTABLE:
        raise InvalidInput(
            "status must be one of: " + ", ".join(sorted(states.REPORTABLE)) + ".", field="status"
        )
    actor = agent_actor(job_agent_id) if job_agent_id else ""
    fields = {"updated_at": Now()}
    if message is not None:
        fields["message"] = message
    if result is not None:
        fields["result"] = result
    if external_id is not None:
        fields["external_id"] = external_id
    ids = (_try_uuid(job_id), _try_uuid(job_agent_id, True), _try_uuid(workspace_id, True))
    db = connections[DEFAULT_DB_ALIAS]
    if db.vendor == "postgresql" and None not in ids:
        job = _report_pg(db, ids[0], claim_uuid, status, actor, fields, result, ids[1], ids[2])
    else:
        job = _report_orm(job_id, claim_uuid, status, actor, fields, result, job_agent_id,
                          workspace_id)
    if job is not None:
        if status == states.IN_PROGRESS:
            observe.emit("progress", job_agent_id=job.job_agent_id)
        else:
            observe.emit("reported", job_agent_id=job.job_agent_id, status=status)
        return job
    # Nothing changed. A retried terminal report after a lost response is a success.
    job = _fetch_job(job_id, workspace_id=workspace_id, job_agent_id=job_agent_id)
    if status in states.TERMINAL and job.status == status and job.last_claim_id == claim_uuid:
        return job
    _refuse(job.id, claim_uuid, "status", workspace_id=workspace_id,
            job_agent_id=job_agent_id, actor=actor)


def _try_uuid(value, none_ok=False):
    """The UUID, or None when it does not parse (the ORM path then handles the input)."""
    if value is None:
        return _ANY if none_ok else None
    try:
        return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))
    except (ValueError, TypeError, AttributeError):
        return None


_ANY = object()  # "no scope" for _try_uuid(..., none_ok=True)


def _report_orm(job_id, claim_uuid, status, actor, fields, result, job_agent_id,
                workspace_id) -> Job | None:
    """Conditional ORM updates (SQLite, and any input the PostgreSQL path leaves to it)."""
    guard = Q(id=job_id, status=states.IN_PROGRESS, last_claim_id=claim_uuid)
    with transaction.atomic():
        qs = _scoped_jobs(workspace_id, job_agent_id).filter(guard)
        if status == states.IN_PROGRESS:
            n = qs.update(**fields)
            kind = JobEvent.PROGRESS_REPORTED
        else:
            n = qs.update(status=status, completed_at=Now(), **fields)
            if n == 1:
                # The job row is ours (locked); its claim row goes with it.
                deleted, _ = JobClaim.objects.filter(job_id=job_id, claim_id=claim_uuid).delete()
                if deleted != 1:  # pragma: no cover - would break invariant 2
                    raise ClaimSuperseded()
            kind = JobEvent.STATUS_REPORTED
        if n != 1:
            return None
        job = Job.objects.get(id=job_id)
        _event(
            job.id,
            kind,
            attempt=job.attempt,
            actor=actor,
            claim_id=claim_uuid,
            status=status,
            has_result=result is not None,
        ).save()
        return job


# PostgreSQL: a report is one statement. The guarded UPDATE of the job row comes first (it
# locks the job row); a terminal report also requires the claim row (same claim_id) in its
# WHERE, and deletes it in a CTE fed by the UPDATE's rows, so the claim row is locked second
# (the documented order). The event is written from the same rows.
_PG_REPORT_SQL = """
WITH done AS (
    UPDATE job SET {sets}updated_at = STATEMENT_TIMESTAMP()
    {claim_from}
    WHERE job.id = %(job)s AND job.status = 'in_progress' AND job.last_claim_id = %(claim)s
      {scope}{claim_guard}
    RETURNING {job_columns}
){gone}, event AS (
    INSERT INTO job_event (job_id, kind, attempt, actor, claim_id, detail, created_at)
    SELECT id, %(kind)s, attempt, %(actor)s, %(claim)s, %(detail)s::jsonb, STATEMENT_TIMESTAMP()
    FROM done
)
SELECT done.*{gone_count} FROM done
"""


_REPORT_SQL_CACHE: dict = {}  # the statement's parts -> its text (a handful of variants)


def report_sql(terminal: bool, sets: str = "", scope: str = "") -> str:
    """The text of the one-statement report (parameters: job, claim, actor, detail, kind,
    and status when terminal, plus those named in `sets` and `scope`). Also what the
    benchmark's raw psycopg loop runs, so that it measures the same SQL."""
    key = (terminal, sets, scope)
    sql = _REPORT_SQL_CACHE.get(key)
    if sql is None:
        parts = {"job_columns": _JOB_COLUMNS, "sets": sets, "scope": scope, "claim_from": "",
                 "claim_guard": "", "gone": "", "gone_count": ""}
        if terminal:
            parts.update(
                sets="status = %(status)s, completed_at = STATEMENT_TIMESTAMP(), " + sets,
                claim_from="FROM job_claim c",
                claim_guard="AND c.job_id = job.id AND c.claim_id = %(claim)s",
                gone=", gone AS (DELETE FROM job_claim c USING done WHERE c.job_id = done.id "
                "AND c.claim_id = %(claim)s RETURNING c.job_id)",
                gone_count=", (SELECT count(*) FROM gone) AS claims_deleted",
            )
        sql = _REPORT_SQL_CACHE[key] = _PG_REPORT_SQL.format(**parts)
    return sql


def _report_pg(db, job_uuid, claim_uuid, status, actor, fields, result, agent_uuid,
               ws_uuid) -> Job | None:
    params = {
        "job": job_uuid,
        "claim": claim_uuid,
        "actor": actor,
        "detail": json.dumps({"status": status, "has_result": result is not None}),
    }
    sets = ""
    for name in ("message", "external_id"):
        if name in fields:
            sets += f"{name} = %({name})s, "
            params[name] = fields[name]
    if "result" in fields:
        sets += "result = %(result)s::jsonb, "
        params["result"] = json.dumps(fields["result"])
    scope = ""
    if agent_uuid is not _ANY:
        scope += "AND job.job_agent_id = %(agent)s "
        params["agent"] = agent_uuid
    if ws_uuid is not _ANY:
        scope += "AND job.workspace_id = %(ws)s "
        params["ws"] = ws_uuid
    terminal = status != states.IN_PROGRESS
    params["kind"] = JobEvent.STATUS_REPORTED if terminal else JobEvent.PROGRESS_REPORTED
    if terminal:
        params["status"] = status
    columns, rows = _pg_run(db, report_sql(terminal, sets, scope), params)
    if not rows:
        return None
    (job,) = _jobs_from_rows(db, columns, rows)
    if status != states.IN_PROGRESS and rows[0][-1] != 1:  # pragma: no cover
        raise RuntimeError("report: the claim row changed under the job row's lock")
    return job


# --- batch status reports ------------------------------------------------------------------

BATCH_REPORT_STATUSES = frozenset(states.REPORTABLE & states.TERMINAL)


@dataclass(frozen=True)
class ReportOutcome:
    """One report's answer in a batch: accepted (with the job's final status and its
    completed_at), or why not (code)."""

    job_id: uuid.UUID
    accepted: bool
    status: str | None = None
    completed_at: dt.datetime | None = None
    code: str | None = None


@dataclass(frozen=True)
class BatchReportResult:
    results: list[ReportOutcome]


@dataclass(frozen=True)
class _Report:
    job_id: uuid.UUID
    claim_id: uuid.UUID
    status: str
    message: str | None
    result: object
    external_id: str | None


def _optional_text(item: dict, name: str, max_length: int | None = None) -> str | None:
    value = item.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or "\x00" in value:
        raise InvalidInput(f"{name} must be a string without NUL characters.", field=name)
    if max_length is not None and len(value) > max_length:
        raise InvalidInput(f"{name} must be at most {max_length} characters.", field=name)
    return value


def _has_nul(value) -> bool:
    """A NUL anywhere in a JSON value's strings (PostgreSQL's jsonb refuses it)."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(_has_nul(v) for v in value)
    return False


def _parse_report_batch(reports) -> list[_Report]:
    limit = jobqueue_settings()["MAX_REPORT_BATCH"]
    if not isinstance(reports, (list, tuple)) or not 1 <= len(reports) <= limit:
        raise InvalidInput(f"reports must be a list of 1 to {limit} items.", field="reports")
    parsed, seen = [], set()
    allowed = ", ".join(sorted(BATCH_REPORT_STATUSES))
    for item in reports:
        if not isinstance(item, dict):
            raise InvalidInput("each report must be an object.", field="reports")
        job_id = _as_uuid(item.get("job_id"), "job_id")
        claim_id = _as_uuid(item.get("claim_id"), "claim_id")
        status = item.get("status")
        if status not in BATCH_REPORT_STATUSES:
            raise InvalidInput(f"status must be one of: {allowed}.", field="status")
        if job_id in seen:
            raise InvalidInput("each job_id may appear only once in reports.", field="reports")
        seen.add(job_id)
        result = item.get("result")
        if result is not None and _has_nul(result):
            raise InvalidInput("result must not contain NUL characters.", field="result")
        parsed.append(_Report(
            job_id, claim_id, status, _optional_text(item, "message"), result,
            _optional_text(item, "external_id", 255),
        ))
    return parsed


# PostgreSQL: one statement ends every report whose claim is current. It locks each job row
# and then its claim row in job_id order (the order batch heartbeats and the reaper use for
# claims, with the job row first as everywhere), so batches never deadlock each other or
# them; the UPDATE repeats every guard of the single report. Job rows are locked FOR NO KEY
# UPDATE (what the UPDATE takes anyway), never FOR UPDATE: a transaction whose deferred
# foreign-key check at COMMIT takes KEY SHARE on these rows (an event inserted for a job it
# does not lock, e.g. a recorded refusal) must not wait on them while holding a row this
# statement waits for (found by test_race_batch_reports_against_each_other_...).
_PG_REPORT_MANY_SQL = """
WITH req AS (
    SELECT * FROM unnest({arrays}) AS r({names})
), locked AS MATERIALIZED (
    SELECT j.id FROM job j
    JOIN req ON req.job_id = j.id
    JOIN job_claim c ON c.job_id = j.id AND c.claim_id = req.claim_id
    WHERE j.job_agent_id = %(agent)s {scope}AND j.status = 'in_progress'
      AND j.last_claim_id = req.claim_id
    ORDER BY j.id
    FOR NO KEY UPDATE OF j FOR UPDATE OF c
), done AS (
    UPDATE job SET status = req.status, completed_at = STATEMENT_TIMESTAMP(),{sets}
        updated_at = STATEMENT_TIMESTAMP()
    FROM locked JOIN req ON req.job_id = locked.id
    WHERE job.id = locked.id AND job.status = 'in_progress' AND job.last_claim_id = req.claim_id
    RETURNING job.id, job.status, job.completed_at, job.attempt, job.last_claim_id
), gone AS (
    DELETE FROM job_claim c USING done
    WHERE c.job_id = done.id AND c.claim_id = done.last_claim_id
    RETURNING c.job_id
), events AS (
    INSERT INTO job_event (job_id, kind, attempt, actor, claim_id, detail, created_at)
    SELECT done.id, %(kind)s, done.attempt, %(actor)s, done.last_claim_id,
           jsonb_build_object('status', done.status, 'has_result', {has_result}),
           STATEMENT_TIMESTAMP()
    FROM done JOIN req ON req.job_id = done.id
)
SELECT done.id, done.status, done.completed_at, (SELECT count(*) FROM gone) FROM done
"""
# The plain acknowledgement (no message, result or external_id in the batch) binds three
# arrays; a batch that sets any of them binds the full set.
_REPORT_MANY_ARRAYS = {
    False: [("jobs", "job_id", "uuid"), ("claims", "claim_id", "uuid"),
            ("statuses", "status", "text")],
    True: [("jobs", "job_id", "uuid"), ("claims", "claim_id", "uuid"),
           ("statuses", "status", "text"), ("messages", "message", "text"),
           ("has_messages", "has_message", "boolean"), ("external_ids", "external_id", "text"),
           ("has_external_ids", "has_external_id", "boolean"), ("results", "result", "text"),
           ("has_results", "has_result", "boolean")],
}
_REPORT_MANY_SETS = """
        message = CASE WHEN req.has_message THEN req.message ELSE job.message END,
        external_id = CASE WHEN req.has_external_id THEN req.external_id
                           ELSE job.external_id END,
        result = CASE WHEN req.has_result THEN req.result::jsonb ELSE job.result END,"""
_PG_REPORT_MANY = {
    (full, scoped): _PG_REPORT_MANY_SQL.format(
        arrays=", ".join(f"%({p})s::{t}[]" for p, _, t in _REPORT_MANY_ARRAYS[full]),
        names=", ".join(n for _, n, _ in _REPORT_MANY_ARRAYS[full]),
        sets=_REPORT_MANY_SETS if full else "",
        has_result="req.has_result" if full else "false",
        scope="AND j.workspace_id = %(ws)s " if scoped else "",
    )
    for full in (False, True)
    for scoped in (False, True)
}


def report_many(job_agent_id, reports, *, workspace_id=None) -> BatchReportResult:
    """End many jobs of one agent at once: `reports` is a list of
    {"job_id", "claim_id", "status", "message"?, "result"?, "external_id"?} with a terminal
    status (successful, failure or cancelled).

    Every report whose claim is current is applied in one transaction (on PostgreSQL, one
    statement), with the single report's guards and events. Each other report is answered
    as the single report would: accepted when it repeats the job's final report (a retry
    after a lost response), else job_cancelled, job_finished, claim_superseded or not_found;
    refusals are recorded like the single path's. Results keep the order of `reports`. Bad
    input (too many items, a malformed UUID, a job twice, a status that does not end the
    job) raises InvalidInput and changes nothing.
    """
    items = _parse_report_batch(reports)
    agent_uuid = _as_uuid(job_agent_id, "job_agent_id")
    ws_uuid = _as_uuid(workspace_id, "workspace_id") if workspace_id is not None else None
    actor = agent_actor(agent_uuid)
    db = connections[DEFAULT_DB_ALIAS]
    if db.vendor == "postgresql":
        done = _report_many_pg(db, items, agent_uuid, ws_uuid, actor)
    else:
        done: dict[uuid.UUID, tuple[str, dt.datetime]] = {}
        with transaction.atomic():
            for r in items:
                fields = {"updated_at": Now()}
                for name in ("message", "result", "external_id"):
                    if getattr(r, name) is not None:
                        fields[name] = getattr(r, name)
                job = _report_orm(r.job_id, r.claim_id, r.status, actor, fields, r.result,
                                  agent_uuid, ws_uuid)
                if job is not None:
                    done[job.id] = (job.status, job.completed_at)
    rest = [r for r in items if r.job_id not in done]
    outcomes = _explain_report_refusals(rest, agent_uuid, ws_uuid, actor) if rest else {}
    results = []
    for r in items:
        if r.job_id in done:
            observe.emit("reported", job_agent_id=agent_uuid, status=r.status)
            status, completed_at = done[r.job_id]
            results.append(ReportOutcome(r.job_id, True, status, completed_at))
        else:
            results.append(outcomes[r.job_id])
    return BatchReportResult(results=results)


def _report_many_pg(db, items, agent_uuid, ws_uuid, actor):
    full = any(r.message is not None or r.result is not None or r.external_id is not None
               for r in items)
    params = {
        "jobs": [r.job_id for r in items],
        "claims": [r.claim_id for r in items],
        "statuses": [r.status for r in items],
        "agent": agent_uuid,
        "kind": JobEvent.STATUS_REPORTED,
        "actor": actor,
    }
    if full:
        params.update(
            messages=[r.message or "" for r in items],
            has_messages=[r.message is not None for r in items],
            external_ids=[r.external_id or "" for r in items],
            has_external_ids=[r.external_id is not None for r in items],
            results=[json.dumps(r.result) if r.result is not None else "" for r in items],
            has_results=[r.result is not None for r in items],
        )
    if ws_uuid is not None:
        params["ws"] = ws_uuid
    _columns, rows = _pg_run(db, _PG_REPORT_MANY[full, ws_uuid is not None], params)
    if rows and rows[0][-1] != len(rows):  # pragma: no cover - would break invariant 2
        raise RuntimeError("batch report: a claim row changed under its job row's lock")
    tz = db.timezone
    return {job_id: (status, completed.astimezone(tz)) for job_id, status, completed, _ in rows}


def _explain_report_refusals(rest, agent_uuid, ws_uuid, actor) -> dict[uuid.UUID, ReportOutcome]:
    """The single report's answers for the reports that changed nothing, and the record of
    each refusal (a retried identical final report is accepted, as it is singly)."""
    jobs = {job.id: job for job in _scoped_jobs(ws_uuid, agent_uuid).filter(
        id__in=[r.job_id for r in rest])}
    outcomes, events = {}, []
    for r in rest:
        job = jobs.get(r.job_id)
        if job is None:
            outcomes[r.job_id] = ReportOutcome(r.job_id, False, code=NotFound.code)
            continue
        if job.status == r.status and job.last_claim_id == r.claim_id:
            outcomes[r.job_id] = ReportOutcome(r.job_id, True, job.status, job.completed_at)
            continue
        if job.status == states.CANCELLED:
            code = JobCancelled.code
        elif job.status in states.TERMINAL:
            code = JobFinished.code
        else:
            code = ClaimSuperseded.code
        outcomes[r.job_id] = ReportOutcome(r.job_id, False, code=code)
        events.append(_event(job.id, JobEvent.STALE_WRITE_REFUSED, attempt=job.attempt,
                             actor=actor, claim_id=r.claim_id, operation="status", code=code))
    if events:
        JobEvent.objects.bulk_create(events)
        for event in events:
            observe.emit("refused", operation="status", code=event.detail["code"])
    return outcomes


def release_job(
    job_id,
    claim_id,
    *,
    reason: str = "",
    retry_after_seconds: int | None = None,
    job_agent_id=None,
    workspace_id=None,
) -> Job:
    """Give the job back: in_progress -> queued (whatever its attempt), claim removed."""
    from .db import NowPlusSeconds

    claim_uuid = _as_uuid(claim_id)
    limit = jobqueue_settings()["MAX_RETRY_AFTER_SECONDS"]
    if retry_after_seconds is not None and (
        not isinstance(retry_after_seconds, int)
        or isinstance(retry_after_seconds, bool)
        or not 0 <= retry_after_seconds <= limit
    ):
        raise InvalidInput(
            f"retry_after_seconds must be an integer from 0 to {limit}.",
            field="retry_after_seconds",
        )
    actor = agent_actor(job_agent_id) if job_agent_id else ""
    with transaction.atomic():
        n = (
            _scoped_jobs(workspace_id, job_agent_id)
            .filter(id=job_id, status=states.IN_PROGRESS, last_claim_id=claim_uuid)
            .update(
                status=states.QUEUED,
                available_at=NowPlusSeconds(retry_after_seconds or 0),
                updated_at=Now(),
            )
        )
        if n == 1:
            deleted, _ = JobClaim.objects.filter(job_id=job_id, claim_id=claim_uuid).delete()
            if deleted != 1:  # pragma: no cover - would break invariant 2
                raise ClaimSuperseded()
            job = Job.objects.get(id=job_id)
            _event(
                job.id,
                JobEvent.RELEASED,
                attempt=job.attempt,
                actor=actor,
                claim_id=claim_uuid,
                reason=(reason or "")[:500],
                retry_after_seconds=retry_after_seconds or 0,
            ).save()
            observe.emit("released", job_agent_id=job.job_agent_id)
            return job
    _refuse(job_id, claim_uuid, "release", workspace_id=workspace_id,
            job_agent_id=job_agent_id, actor=actor)


# --- operator transitions ------------------------------------------------------------------


def _supersede_claim(job_id):
    """Remove the job's claim, if any, and return its claim_id. The caller has already
    locked (updated) the job row, and cleared last_claim_id there: a report carrying the
    superseded claim_id can then never pass for a retried report of its own."""
    claim_id = JobClaim.objects.filter(job_id=job_id).values_list("claim_id", flat=True).first()
    if claim_id is not None:
        JobClaim.objects.filter(job_id=job_id).delete()
    return claim_id


def cancel_job(job_id, *, actor: str = "", reason: str = "", workspace_id=None) -> Job:
    """Any non-terminal job -> cancelled. Supersedes a live claim. Cancelling a cancelled
    job returns it unchanged; any other terminal job raises JobFinished."""
    with transaction.atomic():
        n = (
            _scoped_jobs(workspace_id)
            .filter(id=job_id, status__in=states.ACTIVE)
            .update(
                status=states.CANCELLED, completed_at=Now(), updated_at=Now(), last_claim_id=None
            )
        )
        if n == 1:
            superseded = _supersede_claim(job_id)
            job = Job.objects.get(id=job_id)
            _event(
                job.id,
                JobEvent.CANCELLED,
                attempt=job.attempt,
                actor=actor,
                claim_id=superseded,
                reason=(reason or "")[:500],
                superseded_claim=bool(superseded),
            ).save()
            observe.emit("cancelled")
            return job
    job = _fetch_job(job_id, workspace_id=workspace_id)
    if job.status == states.CANCELLED:
        return job
    raise JobFinished(f"The job is already {job.status}.")


def requeue_job(job_id, *, actor: str = "", reason: str = "", workspace_id=None) -> Job:
    """Any non-pending job -> queued now, with as many further attempts as it was created
    with. Supersedes a live claim: the old holder's claim_id stops working."""
    with transaction.atomic():
        n = (
            _scoped_jobs(workspace_id)
            .filter(id=job_id)
            .exclude(status=states.PENDING)
            .update(
                status=states.QUEUED,
                available_at=Now(),
                completed_at=None,
                max_attempts=F("attempt") + F("initial_max_attempts"),
                updated_at=Now(),
                last_claim_id=None,
            )
        )
        if n == 1:
            superseded = _supersede_claim(job_id)
            job = Job.objects.get(id=job_id)
            _event(
                job.id,
                JobEvent.REQUEUED,
                attempt=job.attempt,
                actor=actor,
                claim_id=superseded,
                reason=(reason or "")[:500],
                superseded_claim=bool(superseded),
                max_attempts=job.max_attempts,
            ).save()
            observe.emit("requeued")
            return job
    _fetch_job(job_id, workspace_id=workspace_id)
    raise InvalidTransition("A pending job cannot be requeued; dispatch it instead.")


def mark_failed(job_id, *, actor: str = "", reason: str = "", workspace_id=None) -> Job:
    """Operator: end a non-terminal job as `failure`, superseding any claim."""
    with transaction.atomic():
        n = (
            _scoped_jobs(workspace_id)
            .filter(id=job_id, status__in=states.ACTIVE)
            .update(
                status=states.FAILURE,
                completed_at=Now(),
                updated_at=Now(),
                message=(reason or "Marked failed by an operator.")[:2000],
                last_claim_id=None,
            )
        )
        if n == 1:
            superseded = _supersede_claim(job_id)
            job = Job.objects.get(id=job_id)
            _event(
                job.id,
                JobEvent.STATUS_REPORTED,
                attempt=job.attempt,
                actor=actor,
                claim_id=superseded,
                status=states.FAILURE,
                reason=(reason or "")[:500],
                superseded_claim=bool(superseded),
            ).save()
            observe.emit("reported", job_agent_id=job.job_agent_id, status=states.FAILURE)
            return job
    job = _fetch_job(job_id, workspace_id=workspace_id)
    raise JobFinished(f"The job is already {job.status}.")


# --- reaper ------------------------------------------------------------------------------


def reap_expired_claims_once(batch_size: int, *, actor: str = "reaper") -> ReapResult:
    """One bounded batch: expired claims -> queued, or expired on the last attempt.

    Job rows are taken with SKIP LOCKED (a job whose report is in flight is left for the
    next sweep, and reapers running at once split the work); the claim rows are then
    locked and re-checked for expiry, so a heartbeat that got there first wins.
    """
    with transaction.atomic():
        job_ids = list(
            Job.objects.filter(status=states.IN_PROGRESS, claim__claim_expires_at__lt=Now())
            .order_by()
            .select_for_update(skip_locked=True, of=("self",))
            .values_list("id", flat=True)[:batch_size]
        )
        if not job_ids:
            return ReapResult()
        expired_claims = list(
            JobClaim.objects.filter(job_id__in=job_ids, claim_expires_at__lt=Now())
            .order_by("job_id")  # claim rows in job_id order, as heartbeat_many locks them
            .select_for_update(of=("self",))
            .select_related("job")
            .only("job_id", "claim_id", "attempt", "job__attempt", "job__max_attempts")
        )
        if not expired_claims:
            return ReapResult(batches=1)
        ids = [c.job_id for c in expired_claims]
        JobClaim.objects.filter(job_id__in=ids).delete()
        to_expire = [c.job_id for c in expired_claims if c.job.attempt >= c.job.max_attempts]
        expiring = set(to_expire)
        to_requeue = [c.job_id for c in expired_claims if c.job.attempt < c.job.max_attempts]
        requeued = expired = 0
        if to_requeue:
            requeued = Job.objects.filter(id__in=to_requeue, status=states.IN_PROGRESS).update(
                status=states.QUEUED, available_at=Now(), updated_at=Now()
            )
        if to_expire:
            expired = Job.objects.filter(id__in=to_expire, status=states.IN_PROGRESS).update(
                status=states.EXPIRED,
                completed_at=Now(),
                updated_at=Now(),
                message="Lease expired on the last attempt.",
            )
        if requeued != len(to_requeue) or expired != len(to_expire):  # pragma: no cover
            raise RuntimeError("reaper: job rows changed under their locks")
        JobEvent.objects.bulk_create(
            _event(
                c.job_id,
                JobEvent.EXPIRED if c.job_id in expiring else JobEvent.REAPED,
                attempt=c.attempt,
                actor=actor,
                claim_id=c.claim_id,
            )
            for c in expired_claims
        )
    observe.emit("reaped", requeued=requeued, expired=expired)
    return ReapResult(requeued=requeued, expired=expired, batches=1)


def count_expired_claims() -> dict:
    """What a sweep would do now, without doing it (for --dry-run and the admin)."""
    qs = JobClaim.objects.filter(claim_expires_at__lt=Now(), job__status=states.IN_PROGRESS)
    total = qs.count()
    last = qs.filter(job__attempt__gte=F("job__max_attempts")).count()
    return {"would_requeue": total - last, "would_expire": last}
