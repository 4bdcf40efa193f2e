-- The statements the service runs by hand on SQLite, each whole under its name (the format
-- of postgresql.sql, read by jobqueue/sql/__init__.py). Everything else on SQLite is the
-- portable ORM path (jobqueue/lifecycle/orm.py).
--
-- UUIDs are stored as 32 hex characters and times as text in Django's format
-- (jobqueue.db.SQLITE_DATETIME_FORMAT, %Y-%m-%d %H:%M:%f in UTC): the database's clock is
-- STRFTIME in that format, so that comparing it with stored values compares equal texts
-- (tests/integration/core/test_sql.py holds the format to Django's). A literal % is %%.
-- Writers are serialized (every write transaction is BEGIN IMMEDIATE): no lock order to keep.


-- name: claim_extend_if_current
-- A heartbeat, as on PostgreSQL: extend the lease to now + lease_seconds if %(claim)s is the
-- job's claim and its lease has not expired, never past the attempt's deadline (MIN() would
-- be NULL without one).
UPDATE job_claim
SET claim_expires_at = CASE
        WHEN deadline_at < STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW', lease_seconds || ' seconds')
        THEN deadline_at
        ELSE STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW', lease_seconds || ' seconds') END,
    heartbeat_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
WHERE job_id = %(job)s AND claim_id = %(claim)s
  AND claim_expires_at > STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
  AND (%(agent)s IS NULL OR job_agent_id = %(agent)s)
RETURNING claim_expires_at, STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')


-- name: claim_extend_if_current_in_workspace
-- The same, for a job of %(workspace)s only.
UPDATE job_claim
SET claim_expires_at = CASE
        WHEN deadline_at < STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW', lease_seconds || ' seconds')
        THEN deadline_at
        ELSE STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW', lease_seconds || ' seconds') END,
    heartbeat_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
WHERE job_id = %(job)s AND claim_id = %(claim)s
  AND claim_expires_at > STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
  AND (%(agent)s IS NULL OR job_agent_id = %(agent)s)
  AND job_id IN (SELECT id FROM job WHERE workspace_id = %(workspace)s)
RETURNING claim_expires_at, STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')


-- name: claim_extend_if_current_many
-- A batch heartbeat: the agent's current, unexpired claims among %(pairs)s, a JSON list of
-- [job_id, claim_id].
UPDATE job_claim
SET claim_expires_at = CASE
        WHEN deadline_at < STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW', lease_seconds || ' seconds')
        THEN deadline_at
        ELSE STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW', lease_seconds || ' seconds') END,
    heartbeat_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
WHERE job_agent_id = %(agent)s AND claim_expires_at > STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
  AND (job_id, claim_id) IN (
      SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(%(pairs)s))
RETURNING job_id, claim_expires_at, STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')


-- name: claim_extend_if_current_many_in_workspace
-- The same, for jobs of %(workspace)s only.
UPDATE job_claim
SET claim_expires_at = CASE
        WHEN deadline_at < STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW', lease_seconds || ' seconds')
        THEN deadline_at
        ELSE STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW', lease_seconds || ' seconds') END,
    heartbeat_at = STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
WHERE job_agent_id = %(agent)s AND claim_expires_at > STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
  AND (job_id, claim_id) IN (
      SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(%(pairs)s))
  AND job_id IN (SELECT id FROM job WHERE workspace_id = %(workspace)s)
RETURNING job_id, claim_expires_at, STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')


-- name: clock_now
-- The database's clock, in the stored format.
SELECT STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')


-- name: database_ping
-- The health check's round trip (/healthz).
SELECT 1
