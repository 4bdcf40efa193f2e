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


-- name: concurrency_admit
-- Give a concurrency key's free slots to its held-back jobs (migration 0027, whose triggers
-- run this statement for the key of the row they fire for, built by its sqlite_admit): of
-- the key's held-back jobs a claim could take now (due, not past expires_at, not a paused
-- agent's), in claim order, those before the first that does not fit (its rank plus the
-- key's slot holders passes its own limit). Run by the reaper's sweep and by a pause or a
-- resume of an agent (lifecycle/concurrency.py); the caller's transaction is the writer.
UPDATE job SET concurrency_held = NULL WHERE id IN (
    SELECT r.id FROM (
        SELECT id, coalesce(concurrency_limit, 1) AS lim,
               ROW_NUMBER() OVER (ORDER BY priority DESC, available_at, created_at) AS rn
        FROM job
        WHERE workspace_id = %(workspace)s AND concurrency_key = %(key)s
          AND status = 'queued' AND concurrency_held
          AND available_at <= STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
          AND (expires_at IS NULL OR expires_at > STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW'))
          AND (label_set_id IS NOT NULL OR job_agent_id NOT IN
               (SELECT id FROM job_agent WHERE paused_at IS NOT NULL))
    ) r
    WHERE r.rn < (
        SELECT coalesce(min(f.rn), 1000000000) FROM (
            SELECT id, coalesce(concurrency_limit, 1) AS lim,
                   ROW_NUMBER() OVER (ORDER BY priority DESC, available_at, created_at) AS rn
            FROM job
            WHERE workspace_id = %(workspace)s AND concurrency_key = %(key)s
              AND status = 'queued' AND concurrency_held
              AND available_at <= STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')
              AND (expires_at IS NULL OR expires_at > STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW'))
              AND (label_set_id IS NOT NULL OR job_agent_id NOT IN
                   (SELECT id FROM job_agent WHERE paused_at IS NOT NULL))
        ) f
        WHERE (SELECT count(*) FROM job
               WHERE workspace_id = %(workspace)s AND concurrency_key = %(key)s
                 AND concurrency_held IS NULL AND status IN ('queued', 'in_progress'))
              + f.rn > f.lim))


-- name: concurrency_keys_held
-- The keys with held-back jobs (the reaper's sweep settles each): job_concurrency_held_idx.
SELECT DISTINCT workspace_id, concurrency_key FROM job
WHERE status = 'queued' AND concurrency_held


-- name: concurrency_hold_paused
-- Before concurrency_admit, outside the triggers: a paused agent's own queued jobs of the
-- key give their slots back (PostgreSQL's jobqueue_concurrency_admit does the same first).
UPDATE job SET concurrency_held = 1
WHERE workspace_id = %(workspace)s AND concurrency_key = %(key)s AND status = 'queued'
  AND concurrency_held IS NULL AND label_set_id IS NULL
  AND job_agent_id IN (SELECT id FROM job_agent WHERE paused_at IS NOT NULL)


-- name: rate_admit
-- Give a rate limit key's free permits to its held-back jobs (migration 0029, whose triggers
-- run this statement for the key of the row they fire for, built by its sqlite_admit): of
-- the key's held-back jobs a claim could take now (due, not past expires_at, not a paused
-- agent's, holding their concurrency slot), in claim order, as many as the key has free
-- permits (count less its jobs claimed in the window and its queued jobs given one); every
-- held-back job when the key has no limit. Run by the wake-up hub when the window opens, the
-- maintenance sweep, a pause or a resume of an agent and a change of the key's limit
-- (lifecycle/ratelimits.py); the caller's transaction is the writer.
UPDATE job SET rate_held = NULL WHERE id IN (SELECT id FROM job WHERE workspace_id = %(workspace)s AND rate_limit_key = %(key)s AND status = 'queued' AND rate_held AND concurrency_held IS NULL AND (NOT EXISTS (SELECT r.count AS n, r.period_seconds AS p FROM rate_limit r WHERE r.workspace_id = %(workspace)s AND r.key = %(key)s) OR (available_at <= STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW') AND (expires_at IS NULL OR expires_at > STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')) AND (label_set_id IS NOT NULL OR job_agent_id NOT IN (SELECT id FROM job_agent WHERE paused_at IS NOT NULL)))) ORDER BY priority DESC, available_at, created_at LIMIT (SELECT CASE WHEN count(*) = 0 THEN -1 ELSE max(0, min(n) - (SELECT count(*) FROM job WHERE workspace_id = %(workspace)s AND rate_limit_key = %(key)s AND ((started_at IS NOT NULL AND started_at > STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW', '-' || (SELECT p FROM (SELECT r.count AS n, r.period_seconds AS p FROM rate_limit r WHERE r.workspace_id = %(workspace)s AND r.key = %(key)s)) || ' seconds')) OR (status = 'queued' AND rate_held IS NULL)))) END FROM (SELECT r.count AS n, r.period_seconds AS p FROM rate_limit r WHERE r.workspace_id = %(workspace)s AND r.key = %(key)s)))


-- name: rate_keys_held
-- The rate limit keys with held-back jobs (maintenance settles each): job_rate_held_idx.
SELECT DISTINCT workspace_id, rate_limit_key FROM job
WHERE status = 'queued' AND rate_held


-- name: rate_keys_held_of
-- Whether a rate limit key has held-back jobs: job_rate_held_idx.
SELECT 1 FROM job
WHERE workspace_id = %(workspace)s AND rate_limit_key = %(key)s AND status = 'queued'
  AND rate_held
LIMIT 1


-- name: rate_take_back
-- A change of a rate limit key's limit (lifecycle/ratelimits.py): its queued jobs given a
-- permit give it back, before rate_admit deals the permits the new limit leaves free in
-- claim order (PostgreSQL's rate_take_back).
UPDATE job SET rate_held = 1
WHERE workspace_id = %(workspace)s AND rate_limit_key = %(key)s AND status = 'queued'
  AND rate_held IS NULL


-- name: rate_hold_paused
-- Before rate_admit, outside the triggers: the key's queued jobs given a permit that a claim
-- cannot take (a paused agent's own; one whose concurrency slot was taken back) give it back
-- (PostgreSQL's jobqueue_rate_admit does the same first).
UPDATE job SET rate_held = 1
WHERE workspace_id = %(workspace)s AND rate_limit_key = %(key)s AND status = 'queued'
  AND rate_held IS NULL
  AND (concurrency_held OR (label_set_id IS NULL
       AND job_agent_id IN (SELECT id FROM job_agent WHERE paused_at IS NOT NULL)))


-- name: rate_window_opens
-- In how many seconds a rate limit key is to be settled again (the SQLite backend announces
-- it for then, as PostgreSQL's jobqueue_rate_admit does): with a permit free, when its first
-- held-back job that is not due yet becomes due (NULL: none); with none free, when the
-- window opens, the oldest claim in it leaving (a period from now when only queued jobs hold
-- its permits). No row: the key has no limit.
SELECT CASE
    WHEN r.count > (
        SELECT count(*) FROM job
        WHERE workspace_id = %(workspace)s AND rate_limit_key = %(key)s
          AND ((started_at IS NOT NULL AND started_at > STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f',
                    'NOW', '-' || r.period_seconds || ' seconds'))
               OR (status = 'queued' AND rate_held IS NULL)))
    THEN (SELECT (julianday(min(available_at)) - julianday('now')) * 86400.0 FROM job
          WHERE workspace_id = %(workspace)s AND rate_limit_key = %(key)s
            AND status = 'queued' AND rate_held
            AND available_at > STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW'))
    ELSE r.period_seconds + coalesce((
        SELECT (julianday(min(started_at)) - julianday('now')) * 86400.0 FROM job
        WHERE workspace_id = %(workspace)s AND rate_limit_key = %(key)s
          AND started_at > STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW',
                                    '-' || r.period_seconds || ' seconds')), 0)
END
FROM rate_limit r WHERE r.workspace_id = %(workspace)s AND r.key = %(key)s
