-- The statements the service runs by hand on PostgreSQL, each whole under its name.
--
-- Read by jobqueue/sql/__init__.py once, at import: a statement runs as `queries.NAME`
-- (postgresql.NAME on this database), never as text built in Python. A name's block is its
-- documentation (the `--` lines, dropped when loaded) and then its text, up to the next name.
-- Parameters are psycopg's named ones, %(name)s; a literal % is written %%.
--
-- Each text is fixed, whatever the values: it is prepared once per connection (the hot
-- cursor, jobqueue/lifecycle/pg/cursor.py), so optional values are NULL ("not given"), and
-- where a condition would change the plan (which rows are locked, a join) the variant is a
-- statement of its own. Every guard is in the WHERE of the statement that writes; every time
-- is the statement's (STATEMENT_TIMESTAMP()), never the app server's.
--
-- Lock order, as everywhere in the lifecycle: a job row first, then its claim row. Claims and
-- reports lock job rows FOR NO KEY UPDATE (what their UPDATE takes anyway), never FOR UPDATE:
-- a foreign-key check's KEY SHARE lock (an event inserted for a job) must not make a claim
-- skip a job or a report wait. Batches lock their rows in job_id order, as the reaper does.
--
-- The job's columns are named, never `job.*`: a prepared `RETURNING job.*` fails ("cached
-- plan must not change result type") on every connection after a migration adds a column.
-- tests/integration/core/test_sql.py checks that each list names every column of the model.
--
-- The rule a claim follows (which job it may take, in which order) is jobqueue/claimrule.py;
-- the locking SELECTs of job_claim_available and job_claim_by_id say the same in SQL, and
-- tests/integration/core/test_claim_rule.py holds them to it.


-- name: job_claim_available
-- Claim up to %(limit)s of the agent's claimable jobs, in claim order, skipping the rows
-- other claimers hold (served by job_claim_order_idx without a sort). For an agent without
-- labels (no labelled job is routed to it): its own jobs, which name it and no label set (a
-- labelled job names the agent that claimed it last). An agent with labels claims with
-- job_claim_available_routed. The locking SELECT is
-- a MATERIALIZED CTE, evaluated exactly once: never `IN (SELECT ... LIMIT n FOR UPDATE)`.
--
-- The backend writes a batch's size into the LIMIT (jobqueue/lifecycle/pg/__init__.py,
-- claim_statement): with the limit a parameter PostgreSQL cannot price a generic plan and
-- re-plans the statement on every call (docs/performance.md, "Prepared statements").
--
-- Then: the gate (the agent is not paused), read under FOR SHARE and only when there is a
-- job to hand out (an empty poll locks nothing). A pause is an UPDATE of that row: it waits
-- for the claims that hold the share lock, and a claim that meets the pause's lock waits for
-- it and re-reads the row (READ COMMITTED re-checks a locked row's WHERE), so no claim hands
-- out a job once a pause has committed. Then the guarded UPDATE (status still 'queued'), the
-- claim rows (the lease, capped at the attempt's deadline: the earlier of the runtime limit
-- and expires_at; LEAST ignores a NULL), all from the rows that UPDATE returned; answered in
-- claim order, each with the checkpoint an earlier attempt saved.
--
-- The claim stores no `claimed` event: its lease and holder go on the job row
-- (claim_lease_seconds, claim_holder), which with last_claim_id, attempt, started_at and
-- job_agent_id says the event (jobqueue/timeline.py, claimed_event). `kept` writes the
-- event row of the claim this one replaces, from the values `locked` read before the UPDATE
-- (the row lock keeps them current): the event of a job's earlier attempt is stored once
-- its job is claimed again. None when that claim's event is stored already: a claim before
-- migration 0022 (claim_lease_seconds is NULL), an operator's transition (it clears
-- last_claim_id), or a claim by an older release during a rolling upgrade (it stored its
-- own and left the row's claim columns as they were: the NOT EXISTS, one probe of the
-- job_id index, only for a job claimed before).
WITH locked AS MATERIALIZED (
    SELECT id, last_claim_id, attempt, started_at, claim_lease_seconds, claim_holder FROM job
    WHERE job_agent_id = %(agent)s AND label_set_id IS NULL
      AND (expires_at IS NULL OR expires_at > STATEMENT_TIMESTAMP())
      AND available_at <= STATEMENT_TIMESTAMP() AND status = 'queued'
      AND concurrency_held IS NULL AND rate_held IS NULL
    ORDER BY priority DESC, COALESCE(fair_at, available_at), created_at
    LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
), gate AS MATERIALIZED (
    SELECT job_agent.id FROM job_agent
    WHERE job_agent.id = %(agent)s AND job_agent.paused_at IS NULL
      AND EXISTS (SELECT 1 FROM locked)
    FOR SHARE
), claimed AS (
    UPDATE job SET status = 'in_progress', attempt = job.attempt + 1,
        last_claim_id = gen_random_uuid(), started_at = STATEMENT_TIMESTAMP(),
        updated_at = STATEMENT_TIMESTAMP(), claim_lease_seconds = %(lease)s::integer,
        claim_holder = NULLIF(%(holder)s, '')
    FROM locked, gate WHERE job.id = locked.id AND job.status = 'queued'
    RETURNING job.id, job.workspace_id, job.job_agent_id, job.status, job.job_agent_config,
        job.dispatch_context, job.result, job.message, job.external_id, job.group_name,
        job.watched, job.attempt, job.max_attempts, job.initial_max_attempts, job.priority,
        job.retry_backoff_seconds, job.max_runtime_seconds, job.expires_at, job.available_at,
        job.idempotency_key, job.unique_key, job.debounce_until, job.schedule_id,
        job.scheduled_for, job.idempotency_fingerprint, job.last_claim_id,
        job.claim_lease_seconds, job.claim_holder,
        job.has_parents, job.has_dependents, job.labels, job.label_set_id,
        job.concurrency_key, job.concurrency_limit, job.concurrency_held,
        job.rate_limit_key, job.rate_held, job.fairness_key, job.fair_at,
        job.created_at,
        job.started_at, job.completed_at, job.updated_at
), claims AS (
    INSERT INTO job_claim (job_id, job_agent_id, claim_id, attempt, lease_seconds, claimed_at,
                           claim_expires_at, deadline_at, holder, idempotency_key)
    SELECT id, job_agent_id, last_claim_id, attempt, %(lease)s::integer, STATEMENT_TIMESTAMP(),
           LEAST(STATEMENT_TIMESTAMP() + make_interval(secs => %(lease)s),
                 STATEMENT_TIMESTAMP() + make_interval(secs => max_runtime_seconds),
                 expires_at),
           LEAST(STATEMENT_TIMESTAMP() + make_interval(secs => max_runtime_seconds),
                 expires_at),
           %(holder)s, %(key)s
    FROM claimed
), kept AS (
    INSERT INTO job_event (job_id, kind, attempt, actor, claim_id, detail, created_at, holder)
    SELECT locked.id, %(kind)s, locked.attempt, %(actor)s, locked.last_claim_id,
           jsonb_build_object('lease_seconds', locked.claim_lease_seconds), locked.started_at,
           COALESCE(locked.claim_holder, '')
    FROM locked JOIN claimed ON claimed.id = locked.id
    WHERE locked.claim_lease_seconds IS NOT NULL AND locked.last_claim_id IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM job_event e WHERE e.job_id = locked.id
                      AND e.claim_id = locked.last_claim_id AND e.kind = %(kind)s::varchar)
)
SELECT claimed.*, STATEMENT_TIMESTAMP() AS db_now, ck.data AS checkpoint
FROM claimed LEFT JOIN job_checkpoint ck ON ck.job_id = claimed.id
ORDER BY priority DESC, COALESCE(fair_at, available_at), created_at


-- name: job_claim_available_routed
-- job_claim_available for an agent with labels (jobqueue/claimrule.py, "Routing"): its own
-- jobs (which name it and no label set) and the labelled jobs of the label sets its labels
-- include, in one claim order. `sets`: the sets of its workspace within its labels, found
-- through job_label_set_labels_gin (migration 0024: the labels qualified by the workspace,
-- so another workspace's sets are never read, nor a set with a label the agent lacks
-- unless it also has one the agent has). Then each source is read in claim order from its
-- own index, the agent's from job_claim_order_idx and each set's from
-- job_label_claim_order_idx, at most %(limit)s rows each, locked as they are read (SKIP
-- LOCKED: a row another claimer holds is passed over, as in job_claim_available); `locked`
-- keeps the first %(limit)s of them in claim order. So the claim reads at most %(limit)s
-- rows a source, whatever number of jobs wait for labels it does not have (or for it), and
-- claimers racing for one set each take the next rows as job_claim_available's do.
-- The rows read and not kept (only when more than one source has jobs) stay locked until
-- this statement's transaction ends (its autocommit): a claim racing it in that instant
-- passes over them and may answer with fewer jobs than are queued, or a named claim of one
-- of them 409 (the agents that wait are woken by the wake-up hub's re-check,
-- JOBQUEUE_WAIT_RECHECK_SECONDS). Reading the candidates unlocked and locking only the kept
-- ones instead left racing claimers of one set with nothing far more often (one snapshot's
-- candidates, all taken by the others).
--
-- The claim writes the claiming agent into job_agent_id (a labelled job names the agent
-- that claimed it last; its reports and heartbeats are that agent's), and `kept` writes the
-- replaced claim's event for the agent that made it.
WITH agent AS MATERIALIZED (
    SELECT workspace_id, jobqueue_label_array(workspace_id, labels) AS labels FROM job_agent
    WHERE id = %(agent)s
), sets AS MATERIALIZED (
    SELECT s.id FROM job_label_set s
    WHERE s.workspace_id = (SELECT workspace_id FROM agent)
      AND jobqueue_label_array(s.workspace_id, s.labels) <@ (SELECT labels FROM agent)
), candidates AS MATERIALIZED (
    SELECT own.* FROM (
        SELECT id, job_agent_id, last_claim_id, attempt, started_at, claim_lease_seconds,
               claim_holder, priority, COALESCE(fair_at, available_at) AS claim_at,
               created_at FROM job
        WHERE job_agent_id = %(agent)s AND label_set_id IS NULL
          AND (expires_at IS NULL OR expires_at > STATEMENT_TIMESTAMP())
          AND available_at <= STATEMENT_TIMESTAMP() AND status = 'queued'
          AND concurrency_held IS NULL AND rate_held IS NULL
        ORDER BY priority DESC, COALESCE(fair_at, available_at), created_at
        LIMIT %(limit)s
        FOR NO KEY UPDATE SKIP LOCKED
    ) AS own
    UNION ALL
    SELECT routed.* FROM sets CROSS JOIN LATERAL (
        SELECT id, job_agent_id, last_claim_id, attempt, started_at, claim_lease_seconds,
               claim_holder, priority, COALESCE(fair_at, available_at) AS claim_at,
               created_at FROM job
        WHERE label_set_id = sets.id
          AND (expires_at IS NULL OR expires_at > STATEMENT_TIMESTAMP())
          AND available_at <= STATEMENT_TIMESTAMP() AND status = 'queued'
          AND concurrency_held IS NULL AND rate_held IS NULL
        ORDER BY priority DESC, COALESCE(fair_at, available_at), created_at
        LIMIT %(limit)s
        FOR NO KEY UPDATE SKIP LOCKED
    ) AS routed
), locked AS MATERIALIZED (
    SELECT * FROM candidates ORDER BY priority DESC, claim_at, created_at
    LIMIT %(limit)s
), gate AS MATERIALIZED (
    SELECT job_agent.id FROM job_agent
    WHERE job_agent.id = %(agent)s AND job_agent.paused_at IS NULL
      AND EXISTS (SELECT 1 FROM locked)
    FOR SHARE
), claimed AS (
    UPDATE job SET status = 'in_progress', attempt = job.attempt + 1,
        last_claim_id = gen_random_uuid(), started_at = STATEMENT_TIMESTAMP(),
        updated_at = STATEMENT_TIMESTAMP(), claim_lease_seconds = %(lease)s::integer,
        claim_holder = NULLIF(%(holder)s, ''), job_agent_id = %(agent)s
    FROM locked, gate WHERE job.id = locked.id AND job.status = 'queued'
    RETURNING job.id, job.workspace_id, job.job_agent_id, job.status, job.job_agent_config,
        job.dispatch_context, job.result, job.message, job.external_id, job.group_name,
        job.watched, job.attempt, job.max_attempts, job.initial_max_attempts, job.priority,
        job.retry_backoff_seconds, job.max_runtime_seconds, job.expires_at, job.available_at,
        job.idempotency_key, job.unique_key, job.debounce_until, job.schedule_id,
        job.scheduled_for, job.idempotency_fingerprint, job.last_claim_id,
        job.claim_lease_seconds, job.claim_holder,
        job.has_parents, job.has_dependents, job.labels, job.label_set_id,
        job.concurrency_key, job.concurrency_limit, job.concurrency_held,
        job.rate_limit_key, job.rate_held, job.fairness_key, job.fair_at,
        job.created_at,
        job.started_at, job.completed_at, job.updated_at
), claims AS (
    INSERT INTO job_claim (job_id, job_agent_id, claim_id, attempt, lease_seconds, claimed_at,
                           claim_expires_at, deadline_at, holder, idempotency_key)
    SELECT id, job_agent_id, last_claim_id, attempt, %(lease)s::integer, STATEMENT_TIMESTAMP(),
           LEAST(STATEMENT_TIMESTAMP() + make_interval(secs => %(lease)s),
                 STATEMENT_TIMESTAMP() + make_interval(secs => max_runtime_seconds),
                 expires_at),
           LEAST(STATEMENT_TIMESTAMP() + make_interval(secs => max_runtime_seconds),
                 expires_at),
           %(holder)s, %(key)s
    FROM claimed
), kept AS (
    INSERT INTO job_event (job_id, kind, attempt, actor, claim_id, detail, created_at, holder)
    SELECT locked.id, %(kind)s, locked.attempt, 'agent:' || locked.job_agent_id::text,
           locked.last_claim_id,
           jsonb_build_object('lease_seconds', locked.claim_lease_seconds), locked.started_at,
           COALESCE(locked.claim_holder, '')
    FROM locked JOIN claimed ON claimed.id = locked.id
    WHERE locked.claim_lease_seconds IS NOT NULL AND locked.last_claim_id IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM job_event e WHERE e.job_id = locked.id
                      AND e.claim_id = locked.last_claim_id AND e.kind = %(kind)s::varchar)
)
SELECT claimed.*, STATEMENT_TIMESTAMP() AS db_now, ck.data AS checkpoint
FROM claimed LEFT JOIN job_checkpoint ck ON ck.job_id = claimed.id
ORDER BY priority DESC, COALESCE(fair_at, available_at), created_at




-- name: job_claim_by_id
-- The same for the one job %(job)s (no row when it is not claimable now, or not routed to
-- this agent: its own, or labelled with a set its labels include), and with %(expected)s
-- only while the job's attempt still equals it (NULL: any attempt). Found by its primary
-- key, so the optional conditions change no plan. As job_claim_available_routed, it writes
-- the claiming agent into job_agent_id (the same value for the agent's own job) and the
-- replaced claim's event for the agent that made it.
WITH locked AS MATERIALIZED (
    SELECT id, job_agent_id, last_claim_id, attempt, started_at, claim_lease_seconds,
           claim_holder FROM job
    WHERE id = %(job)s
      AND ((job_agent_id = %(agent)s AND label_set_id IS NULL)
           OR EXISTS (SELECT 1 FROM job_agent a JOIN job_label_set s
                      ON s.workspace_id = a.workspace_id
                      WHERE a.id = %(agent)s AND s.id = job.label_set_id
                        AND a.labels @> s.labels))
      AND (%(expected)s::integer IS NULL OR attempt = %(expected)s::integer)
      AND (expires_at IS NULL OR expires_at > STATEMENT_TIMESTAMP())
      AND available_at <= STATEMENT_TIMESTAMP() AND status = 'queued'
      AND concurrency_held IS NULL AND rate_held IS NULL
    FOR NO KEY UPDATE SKIP LOCKED
), gate AS MATERIALIZED (
    SELECT job_agent.id FROM job_agent
    WHERE job_agent.id = %(agent)s AND job_agent.paused_at IS NULL
      AND EXISTS (SELECT 1 FROM locked)
    FOR SHARE
), claimed AS (
    UPDATE job SET status = 'in_progress', attempt = job.attempt + 1,
        last_claim_id = gen_random_uuid(), started_at = STATEMENT_TIMESTAMP(),
        updated_at = STATEMENT_TIMESTAMP(), claim_lease_seconds = %(lease)s::integer,
        claim_holder = NULLIF(%(holder)s, ''), job_agent_id = %(agent)s
    FROM locked, gate WHERE job.id = locked.id AND job.status = 'queued'
    RETURNING job.id, job.workspace_id, job.job_agent_id, job.status, job.job_agent_config,
        job.dispatch_context, job.result, job.message, job.external_id, job.group_name,
        job.watched, job.attempt, job.max_attempts, job.initial_max_attempts, job.priority,
        job.retry_backoff_seconds, job.max_runtime_seconds, job.expires_at, job.available_at,
        job.idempotency_key, job.unique_key, job.debounce_until, job.schedule_id,
        job.scheduled_for, job.idempotency_fingerprint, job.last_claim_id,
        job.claim_lease_seconds, job.claim_holder,
        job.has_parents, job.has_dependents, job.labels, job.label_set_id,
        job.concurrency_key, job.concurrency_limit, job.concurrency_held,
        job.rate_limit_key, job.rate_held, job.fairness_key, job.fair_at,
        job.created_at,
        job.started_at, job.completed_at, job.updated_at
), claims AS (
    INSERT INTO job_claim (job_id, job_agent_id, claim_id, attempt, lease_seconds, claimed_at,
                           claim_expires_at, deadline_at, holder, idempotency_key)
    SELECT id, job_agent_id, last_claim_id, attempt, %(lease)s::integer, STATEMENT_TIMESTAMP(),
           LEAST(STATEMENT_TIMESTAMP() + make_interval(secs => %(lease)s),
                 STATEMENT_TIMESTAMP() + make_interval(secs => max_runtime_seconds),
                 expires_at),
           LEAST(STATEMENT_TIMESTAMP() + make_interval(secs => max_runtime_seconds),
                 expires_at),
           %(holder)s, %(key)s
    FROM claimed
), kept AS (
    INSERT INTO job_event (job_id, kind, attempt, actor, claim_id, detail, created_at, holder)
    SELECT locked.id, %(kind)s, locked.attempt, 'agent:' || locked.job_agent_id::text,
           locked.last_claim_id,
           jsonb_build_object('lease_seconds', locked.claim_lease_seconds), locked.started_at,
           COALESCE(locked.claim_holder, '')
    FROM locked JOIN claimed ON claimed.id = locked.id
    WHERE locked.claim_lease_seconds IS NOT NULL AND locked.last_claim_id IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM job_event e WHERE e.job_id = locked.id
                      AND e.claim_id = locked.last_claim_id AND e.kind = %(kind)s::varchar)
)
SELECT claimed.*, STATEMENT_TIMESTAMP() AS db_now, ck.data AS checkpoint
FROM claimed LEFT JOIN job_checkpoint ck ON ck.job_id = claimed.id


-- name: label_sets_within
-- The label sets of %(workspace)s whose labels are all among %(labels)s (an agent's): the
-- sets it matches (jobqueue/claimrule.py, label_sets_for), through job_label_set_labels_gin
-- (migration 0024), never reading a set none of whose labels it has.
SELECT id FROM job_label_set
WHERE workspace_id = %(workspace)s
  AND jobqueue_label_array(workspace_id, labels)
      <@ jobqueue_label_array(%(workspace)s::uuid, %(labels)s::jsonb)


-- name: claim_key_lock
-- Serialize the keyed claims of one agent and idempotency key until the transaction ends,
-- so that a retry racing its own first request finds the first's claims.
SELECT pg_advisory_xact_lock(hashtextextended(%(lock)s, 0))


-- name: concurrency_settle
-- Give a concurrency key's free slots to its held jobs (migration 0027,
-- jobqueue_concurrency_try) if no transaction holds the key's lock: true; false: one does
-- (it gives them out itself, or announces the key again). Run by the wake-up hub for a key
-- a transaction announced ('k:<workspace>:<key>') and by maintenance for every key with
-- held jobs, each in its own transaction.
SELECT jobqueue_concurrency_try(%(workspace)s::uuid, %(key)s::text)


-- name: concurrency_keys_held
-- The keys with held jobs (maintenance settles each): job_concurrency_held_idx.
SELECT DISTINCT workspace_id, concurrency_key FROM job
WHERE status = 'queued' AND concurrency_held


-- name: rate_settle
-- Give a rate limit key's free permits to its held jobs (migration 0029, jobqueue_rate_try)
-- if no transaction holds the key's lock: true; false: one does (it gives them out itself,
-- or announces the key again). Run by the wake-up hub for a key announced ('r:<workspace>:
-- <key>', when its window opens), by maintenance for every key with held jobs, and when a
-- key's limit is set or removed (lifecycle/ratelimits.py), each in its own transaction.
SELECT jobqueue_rate_try(%(workspace)s::uuid, %(key)s::text)


-- name: rate_key_lock
-- Take a rate limit key's lock (jobqueue_rate_try's, migration 0029) until the transaction
-- ends, waiting for it: a change of the key's limit deals its permits again under it.
SELECT pg_advisory_xact_lock(hashtextextended(
    'jobqueue.rate:' || %(workspace)s::uuid::text || ':' || %(key)s::text, 0))


-- name: rate_take_back
-- A change of a rate limit key's limit (lifecycle/ratelimits.py, under rate_key_lock): its
-- queued jobs given a permit give it back, before jobqueue_rate_admit deals the permits the
-- new limit leaves free in claim order (none of those jobs was claimed: a permit given
-- before a first limit, or under a higher one, would let the backlog through at once).
-- Passes over the rows a claim in flight holds (it moves its job into the window).
UPDATE job SET rate_held = true WHERE id IN (
    SELECT id FROM job
    WHERE workspace_id = %(workspace)s AND rate_limit_key = %(key)s AND status = 'queued'
      AND rate_held IS NULL
    FOR NO KEY UPDATE SKIP LOCKED)


-- name: rate_keys_held
-- The rate limit keys with held jobs (maintenance settles each): job_rate_held_idx.
SELECT DISTINCT workspace_id, rate_limit_key FROM job
WHERE status = 'queued' AND rate_held


-- name: effect_ledger_lock
-- Serialize the begins of new keys in the effect ledger of %(job)s until the transaction
-- ends (lifecycle/effects.py): each counts the job's entries after the one before it
-- committed, so racing begins never pass JOBQUEUE_MAX_EFFECTS_PER_JOB. An advisory lock, not
-- the job row's: the begin holds its claim row FOR SHARE already, and a report, a requeue or
-- the reaper lock the job row and then the claim row (the other order would deadlock).
SELECT pg_advisory_xact_lock(hashtextextended('jobqueue.effects:' || %(job)s::text, 0))


-- name: unique_key_lock
-- Serialize the creates of one workspace with one unique_key until the transaction ends
-- (jobqueue/lifecycle/create.py): each finds the live jobs with the key after the one before
-- it committed, so N racing creates make one job. A create without a key never runs it.
SELECT pg_advisory_xact_lock(hashtextextended(
    'jobqueue.unique:' || %(workspace)s::text || ':' || %(key)s::text, 0))


-- name: job_set_state_if_running
-- End the job %(job)s with the terminal %(status)s if %(claim)s is still its claim, within
-- the caller's scope (%(agent)s: an agent's token sees its own jobs; %(workspace)s: a
-- workspace key its workspace's; NULL: no such limit) and before any clock has ended the
-- attempt (its runtime limit from started_at, the job's expires_at). message, result and
-- external_id: NULL keeps the job's value (the field was not given).
--
-- The UPDATE locks the job row and requires the claim row (same claim_id) in its WHERE; the
-- claim row is then deleted (locked second; by the job's id as well as done's: with only the
-- join, a connection that prepared it while job_claim was small and unanalysed kept a
-- generic plan that scanned the whole table). claims_deleted is 1. A successful report
-- publishes its claim's staged artifacts (jobqueue/lifecycle/artifacts.py) and unpublishes
-- an earlier set (a job requeued after a success); an ended job gets one webhook outbox row
-- per endpoint of its workspace that wants job.finished (lifecycle/finished.py; events `[]`:
-- all), its body fixed here: jobqueue_finished_payload (migration 0014) of the job as done
-- returns it, as lifecycle/finished.py writes it. The report's status_reported event is
-- written only when the job row cannot say it (jobqueue/timeline.py, which reads it from the
-- row): another actor than the job's agent, or a message or result the report did not give
-- and the job keeps from before. A producer waiting for the job (job.watched,
-- set before its wait's first check) is told by a NOTIFY on the channel
-- jobqueue.wakeups.CHANNEL, delivered on commit, only then:
-- a NOTIFY serializes commits cluster-wide (15-30 % of the core cycle at 16 workers when
-- every report sent one). A job that others depend on (job.has_dependents, false for a
-- plain job, which pays nothing more) settles them in the same statement:
-- jobqueue_settle_dependents (migration 0021) queues the dependents whose parents have all
-- succeeded, or cancels them (dependency_failed) down the graph when it ended otherwise.
-- The CTEs run because the final SELECT counts them.
WITH done AS (
    UPDATE job SET status = %(status)s, completed_at = STATEMENT_TIMESTAMP(),
        message = COALESCE(%(message)s, job.message),
        result = COALESCE(%(result)s::jsonb, job.result),
        external_id = COALESCE(%(external_id)s, job.external_id),
        updated_at = STATEMENT_TIMESTAMP()
    FROM job_claim c
    WHERE job.id = %(job)s AND job.status = 'in_progress' AND job.last_claim_id = %(claim)s
      AND (%(agent)s::uuid IS NULL OR job.job_agent_id = %(agent)s)
      AND (%(workspace)s::uuid IS NULL OR job.workspace_id = %(workspace)s)
      AND (job.max_runtime_seconds IS NULL
           OR job.started_at + make_interval(secs => job.max_runtime_seconds)
              > STATEMENT_TIMESTAMP())
      AND (job.expires_at IS NULL OR job.expires_at > STATEMENT_TIMESTAMP())
      AND c.job_id = job.id AND c.claim_id = %(claim)s
    RETURNING job.id, job.workspace_id, job.job_agent_id, job.status, job.job_agent_config,
        job.dispatch_context, job.result, job.message, job.external_id, job.group_name,
        job.watched, job.attempt, job.max_attempts, job.initial_max_attempts, job.priority,
        job.retry_backoff_seconds, job.max_runtime_seconds, job.expires_at, job.available_at,
        job.idempotency_key, job.unique_key, job.debounce_until, job.schedule_id,
        job.scheduled_for, job.idempotency_fingerprint, job.last_claim_id,
        job.claim_lease_seconds, job.claim_holder,
        job.has_parents, job.has_dependents, job.labels, job.label_set_id,
        job.concurrency_key, job.concurrency_limit, job.concurrency_held,
        job.rate_limit_key, job.rate_held, job.fairness_key, job.fair_at,
        job.created_at,
        job.started_at, job.completed_at, job.updated_at
), gone AS (
    DELETE FROM job_claim c USING done
    WHERE c.job_id = %(job)s AND c.job_id = done.id AND c.claim_id = %(claim)s
    RETURNING c.job_id
), published AS (
    UPDATE job_artifact a SET published_at = CASE
        WHEN a.claim_id = %(claim)s AND a.state = 'staged' THEN STATEMENT_TIMESTAMP() END
    FROM done WHERE a.job_id = done.id AND done.status = 'successful'
      AND ((a.claim_id = %(claim)s AND a.state = 'staged') OR a.published_at IS NOT NULL)
), event AS (
    INSERT INTO job_event (job_id, kind, attempt, actor, claim_id, detail, created_at)
    SELECT id, %(kind)s, attempt, %(actor)s, %(claim)s, %(detail)s::jsonb, STATEMENT_TIMESTAMP()
    FROM done
    WHERE NOT (%(actor)s::varchar = 'agent:' || done.job_agent_id::text
               AND (%(message)s IS NOT NULL OR done.message = '')
               AND (%(result)s::jsonb IS NOT NULL OR done.result IS NULL))
), hook AS (
    INSERT INTO webhook_delivery (id, endpoint_id, job_id, payload)
    SELECT gen_random_uuid(), e.id, done.id, jobqueue_finished_payload(to_jsonb(done))
    FROM done JOIN webhook_endpoint e ON e.workspace_id = done.workspace_id
    WHERE done.status IN ('successful', 'failure', 'cancelled', 'expired')
      AND (e.events = '[]'::jsonb OR jsonb_exists(e.events, 'job.finished'))
), notified AS (
    SELECT pg_notify('jobqueue_wake', 'j:' || done.id::text) FROM done
    WHERE done.watched
), settled AS (
    SELECT jobqueue_settle_dependents(done.id, done.status) FROM done
    WHERE done.has_dependents AND done.status <> 'queued'
)
SELECT done.*, (SELECT count(*) FROM gone) AS claims_deleted
FROM done CROSS JOIN (SELECT count(*) FROM notified) AS n
    CROSS JOIN (SELECT count(*) FROM settled) AS s


-- name: job_fail_or_retry_if_running
-- A retryable failure ({"status": "failure", "retry": true}) if %(claim)s is still the job's
-- claim, guarded and scoped as job_set_state_if_running: while attempts remain the job goes
-- back to 'queued', claimable after the backoff (retry_backoff_seconds, NULL: %(backoff)s,
-- doubled per attempt made, at most %(backoff_cap)s, shortened by up to %(jitter)s of
-- itself); on the last attempt it ends as failure. The claim row goes as on a final report;
-- the event says which (requeued).
WITH done AS (
    UPDATE job SET
        status = CASE WHEN job.attempt < job.max_attempts THEN 'queued' ELSE 'failure' END,
        completed_at = CASE WHEN job.attempt < job.max_attempts THEN NULL
                            ELSE STATEMENT_TIMESTAMP() END,
        available_at = CASE WHEN job.attempt < job.max_attempts
            THEN STATEMENT_TIMESTAMP() + make_interval(secs =>
                LEAST(%(backoff_cap)s::float8, COALESCE(job.retry_backoff_seconds, %(backoff)s)
                      * power(2::float8, job.attempt - 1)) * (1 - %(jitter)s::float8 * random()))
            ELSE job.available_at END,
        message = COALESCE(%(message)s, job.message),
        result = COALESCE(%(result)s::jsonb, job.result),
        external_id = COALESCE(%(external_id)s, job.external_id),
        updated_at = STATEMENT_TIMESTAMP()
    FROM job_claim c
    WHERE job.id = %(job)s AND job.status = 'in_progress' AND job.last_claim_id = %(claim)s
      AND (%(agent)s::uuid IS NULL OR job.job_agent_id = %(agent)s)
      AND (%(workspace)s::uuid IS NULL OR job.workspace_id = %(workspace)s)
      AND (job.max_runtime_seconds IS NULL
           OR job.started_at + make_interval(secs => job.max_runtime_seconds)
              > STATEMENT_TIMESTAMP())
      AND (job.expires_at IS NULL OR job.expires_at > STATEMENT_TIMESTAMP())
      AND c.job_id = job.id AND c.claim_id = %(claim)s
    RETURNING job.id, job.workspace_id, job.job_agent_id, job.status, job.job_agent_config,
        job.dispatch_context, job.result, job.message, job.external_id, job.group_name,
        job.watched, job.attempt, job.max_attempts, job.initial_max_attempts, job.priority,
        job.retry_backoff_seconds, job.max_runtime_seconds, job.expires_at, job.available_at,
        job.idempotency_key, job.unique_key, job.debounce_until, job.schedule_id,
        job.scheduled_for, job.idempotency_fingerprint, job.last_claim_id,
        job.claim_lease_seconds, job.claim_holder,
        job.has_parents, job.has_dependents, job.labels, job.label_set_id,
        job.concurrency_key, job.concurrency_limit, job.concurrency_held,
        job.rate_limit_key, job.rate_held, job.fairness_key, job.fair_at,
        job.created_at,
        job.started_at, job.completed_at, job.updated_at
), gone AS (
    DELETE FROM job_claim c USING done
    WHERE c.job_id = %(job)s AND c.job_id = done.id AND c.claim_id = %(claim)s
    RETURNING c.job_id
), event AS (
    INSERT INTO job_event (job_id, kind, attempt, actor, claim_id, detail, created_at)
    SELECT id, %(kind)s, attempt, %(actor)s, %(claim)s,
           %(detail)s::jsonb || jsonb_build_object('requeued', status = 'queued'),
           STATEMENT_TIMESTAMP()
    FROM done
), hook AS (
    INSERT INTO webhook_delivery (id, endpoint_id, job_id, payload)
    SELECT gen_random_uuid(), e.id, done.id, jobqueue_finished_payload(to_jsonb(done))
    FROM done JOIN webhook_endpoint e ON e.workspace_id = done.workspace_id
    WHERE done.status IN ('successful', 'failure', 'cancelled', 'expired')
      AND (e.events = '[]'::jsonb OR jsonb_exists(e.events, 'job.finished'))
), notified AS (
    SELECT pg_notify('jobqueue_wake', 'j:' || done.id::text) FROM done
    WHERE done.watched
), settled AS (
    SELECT jobqueue_settle_dependents(done.id, done.status) FROM done
    WHERE done.has_dependents AND done.status <> 'queued'
)
SELECT done.*, (SELECT count(*) FROM gone) AS claims_deleted
FROM done CROSS JOIN (SELECT count(*) FROM notified) AS n
    CROSS JOIN (SELECT count(*) FROM settled) AS s


-- name: job_set_progress_if_running
-- Record progress (message, result, external_id; NULL keeps the value) if %(claim)s is
-- still the job's claim, guarded and scoped as job_set_state_if_running. Never touches the
-- lease.
WITH done AS (
    UPDATE job SET
        message = COALESCE(%(message)s, job.message),
        result = COALESCE(%(result)s::jsonb, job.result),
        external_id = COALESCE(%(external_id)s, job.external_id),
        updated_at = STATEMENT_TIMESTAMP()
    WHERE job.id = %(job)s AND job.status = 'in_progress' AND job.last_claim_id = %(claim)s
      AND (%(agent)s::uuid IS NULL OR job.job_agent_id = %(agent)s)
      AND (%(workspace)s::uuid IS NULL OR job.workspace_id = %(workspace)s)
      AND (job.max_runtime_seconds IS NULL
           OR job.started_at + make_interval(secs => job.max_runtime_seconds)
              > STATEMENT_TIMESTAMP())
      AND (job.expires_at IS NULL OR job.expires_at > STATEMENT_TIMESTAMP())
    RETURNING job.id, job.workspace_id, job.job_agent_id, job.status, job.job_agent_config,
        job.dispatch_context, job.result, job.message, job.external_id, job.group_name,
        job.watched, job.attempt, job.max_attempts, job.initial_max_attempts, job.priority,
        job.retry_backoff_seconds, job.max_runtime_seconds, job.expires_at, job.available_at,
        job.idempotency_key, job.unique_key, job.debounce_until, job.schedule_id,
        job.scheduled_for, job.idempotency_fingerprint, job.last_claim_id,
        job.claim_lease_seconds, job.claim_holder,
        job.has_parents, job.has_dependents, job.labels, job.label_set_id,
        job.concurrency_key, job.concurrency_limit, job.concurrency_held,
        job.rate_limit_key, job.rate_held, job.fairness_key, job.fair_at,
        job.created_at,
        job.started_at, job.completed_at, job.updated_at
), event AS (
    INSERT INTO job_event (job_id, kind, attempt, actor, claim_id, detail, created_at)
    SELECT id, %(kind)s, attempt, %(actor)s, %(claim)s, %(detail)s::jsonb, STATEMENT_TIMESTAMP()
    FROM done
)
SELECT done.* FROM done


-- name: job_set_state_if_running_many
-- End every job of the batch whose claim is current, in one statement, repeating every guard
-- of the single report. It locks each job row and then its claim row in job_id order (the
-- order of batch heartbeats and the reaper, job row first as everywhere), so batches never
-- deadlock each other or them. FOR NO KEY UPDATE, not FOR UPDATE: a transaction whose
-- deferred foreign-key check at COMMIT takes KEY SHARE on these rows (an event inserted for a
-- job it does not lock, e.g. a recorded refusal) must not wait on them while holding a row
-- this statement waits for. %(messages)s, %(results)s and %(external_ids)s may be NULL (a
-- plain acknowledgement binds three arrays): unnest pads them. So may %(retries)s (no report
-- asks a retry); a true one is a retryable failure, with job_fail_or_retry_if_running's
-- backoff. An event's message is cut at %(message_chars)s characters
-- (jobqueue.timeline.MESSAGE_CHARS), and written only where the job row cannot say it, as
-- job_set_state_if_running's (a retry's always). Answers (id, status, completed_at, workspace_id, the
-- number of claim rows deleted) per job it ended.
WITH req AS (
    SELECT * FROM unnest(%(jobs)s::uuid[], %(claims)s::uuid[], %(statuses)s::text[],
                         %(messages)s::text[], %(results)s::text[], %(external_ids)s::text[],
                         %(retries)s::boolean[])
        AS r(job_id, claim_id, status, message, result, external_id, retry)
), locked AS MATERIALIZED (
    SELECT j.id FROM job j
    JOIN req ON req.job_id = j.id
    JOIN job_claim c ON c.job_id = j.id AND c.claim_id = req.claim_id
    WHERE j.job_agent_id = %(agent)s AND j.status = 'in_progress'
      AND (%(workspace)s::uuid IS NULL OR j.workspace_id = %(workspace)s)
      AND j.last_claim_id = req.claim_id
      AND (j.max_runtime_seconds IS NULL
           OR j.started_at + make_interval(secs => j.max_runtime_seconds)
              > STATEMENT_TIMESTAMP())
      AND (j.expires_at IS NULL OR j.expires_at > STATEMENT_TIMESTAMP())
    ORDER BY j.id
    FOR NO KEY UPDATE OF j FOR UPDATE OF c
), done AS (
    UPDATE job SET
        status = CASE WHEN (req.retry AND job.attempt < job.max_attempts) THEN 'queued'
                      ELSE req.status END,
        completed_at = CASE WHEN (req.retry AND job.attempt < job.max_attempts) THEN NULL
                            ELSE STATEMENT_TIMESTAMP() END,
        available_at = CASE WHEN (req.retry AND job.attempt < job.max_attempts)
            THEN STATEMENT_TIMESTAMP() + make_interval(secs =>
                LEAST(%(backoff_cap)s::float8, COALESCE(job.retry_backoff_seconds, %(backoff)s)
                      * power(2::float8, job.attempt - 1)) * (1 - %(jitter)s::float8 * random()))
            ELSE job.available_at END,
        message = COALESCE(req.message, job.message),
        result = COALESCE(req.result::jsonb, job.result),
        external_id = COALESCE(req.external_id, job.external_id),
        updated_at = STATEMENT_TIMESTAMP()
    FROM locked JOIN req ON req.job_id = locked.id
    WHERE job.id = locked.id AND job.status = 'in_progress' AND job.last_claim_id = req.claim_id
      AND (job.max_runtime_seconds IS NULL
           OR job.started_at + make_interval(secs => job.max_runtime_seconds)
              > STATEMENT_TIMESTAMP())
      AND (job.expires_at IS NULL OR job.expires_at > STATEMENT_TIMESTAMP())
    RETURNING job.id, job.status, job.completed_at, job.attempt, job.last_claim_id,
        job.workspace_id, job.watched, job.job_agent_id, job.job_agent_config, job.result,
        job.message, job.external_id, job.max_attempts, job.priority, job.idempotency_key,
        job.available_at, job.created_at, job.started_at, job.updated_at, job.has_dependents
), gone AS (
    DELETE FROM job_claim c USING done
    WHERE c.job_id = done.id AND c.claim_id = done.last_claim_id
    RETURNING c.job_id
), published AS (
    UPDATE job_artifact a SET published_at = CASE
        WHEN a.claim_id = done.last_claim_id AND a.state = 'staged' THEN STATEMENT_TIMESTAMP() END
    FROM done WHERE a.job_id = done.id AND done.status = 'successful'
      AND ((a.claim_id = done.last_claim_id AND a.state = 'staged') OR a.published_at IS NOT NULL)
), events AS (
    INSERT INTO job_event (job_id, kind, attempt, actor, claim_id, detail, created_at)
    SELECT done.id, %(kind)s, done.attempt, %(actor)s, done.last_claim_id,
           jsonb_build_object('status', req.status, 'has_result', req.result IS NOT NULL)
           || CASE WHEN req.retry THEN jsonb_build_object('retry', true,
                   'requeued', done.status = 'queued') ELSE '{}'::jsonb END
           || CASE WHEN req.message <> '' THEN jsonb_build_object('message',
                   left(req.message, %(message_chars)s)) ELSE '{}'::jsonb END,
           STATEMENT_TIMESTAMP()
    FROM done JOIN req ON req.job_id = done.id
    WHERE req.retry IS TRUE
       OR NOT (%(actor)s::varchar = 'agent:' || done.job_agent_id::text
               AND (req.message IS NOT NULL OR done.message = '')
               AND (req.result IS NOT NULL OR done.result IS NULL))
), hook AS (
    INSERT INTO webhook_delivery (id, endpoint_id, job_id, payload)
    SELECT gen_random_uuid(), e.id, done.id, jobqueue_finished_payload(to_jsonb(done))
    FROM done JOIN webhook_endpoint e ON e.workspace_id = done.workspace_id
    WHERE done.status IN ('successful', 'failure', 'cancelled', 'expired')
      AND (e.events = '[]'::jsonb OR jsonb_exists(e.events, 'job.finished'))
), notified AS (
    SELECT pg_notify('jobqueue_wake', 'j:' || done.id::text) FROM done
    WHERE done.watched
), settled AS (
    SELECT jobqueue_settle_dependents(done.id, done.status) FROM done
    WHERE done.has_dependents AND done.status <> 'queued'
)
SELECT done.id, done.status, done.completed_at, done.workspace_id, (SELECT count(*) FROM gone)
FROM done CROSS JOIN (SELECT count(*) FROM notified) AS n
    CROSS JOIN (SELECT count(*) FROM settled) AS s


-- name: claim_extend_if_current
-- A heartbeat (job_claim only, never job): extend the lease to now + lease_seconds if
-- %(claim)s is the job's claim and its lease has not expired (a heartbeat never revives an
-- expired lease); never past the attempt's deadline (LEAST ignores a NULL deadline_at).
-- %(agent)s NULL: any agent's claim (a workspace key's heartbeat).
UPDATE job_claim
SET claim_expires_at = LEAST(STATEMENT_TIMESTAMP() + make_interval(secs => lease_seconds),
                             deadline_at),
    heartbeat_at = STATEMENT_TIMESTAMP()
WHERE job_id = %(job)s AND claim_id = %(claim)s AND claim_expires_at > STATEMENT_TIMESTAMP()
  AND (%(agent)s::uuid IS NULL OR job_agent_id = %(agent)s)
RETURNING claim_expires_at, STATEMENT_TIMESTAMP()


-- name: claim_extend_if_current_in_workspace
-- The same, for a job of %(workspace)s only.
UPDATE job_claim
SET claim_expires_at = LEAST(STATEMENT_TIMESTAMP() + make_interval(secs => lease_seconds),
                             deadline_at),
    heartbeat_at = STATEMENT_TIMESTAMP()
WHERE job_id = %(job)s AND claim_id = %(claim)s AND claim_expires_at > STATEMENT_TIMESTAMP()
  AND (%(agent)s::uuid IS NULL OR job_agent_id = %(agent)s)
  AND job_id IN (SELECT id FROM job WHERE workspace_id = %(workspace)s)
RETURNING claim_expires_at, STATEMENT_TIMESTAMP()


-- name: claim_extend_if_current_many
-- A batch heartbeat: renew every claim of the batch (%(jobs)s and %(claims)s, paired) that
-- is the agent's, current and unexpired; the claim rows are locked in job_id order (as the
-- reaper locks them) first.
WITH req AS (
    SELECT * FROM unnest(%(jobs)s::uuid[], %(claims)s::uuid[]) AS r(job_id, claim_id)
), locked AS (
    SELECT c.job_id FROM job_claim c
    JOIN req ON req.job_id = c.job_id AND req.claim_id = c.claim_id
    WHERE c.job_agent_id = %(agent)s AND c.claim_expires_at > STATEMENT_TIMESTAMP()
    ORDER BY c.job_id
    FOR UPDATE OF c
)
UPDATE job_claim c
SET claim_expires_at = LEAST(STATEMENT_TIMESTAMP() + make_interval(secs => c.lease_seconds),
                             c.deadline_at),
    heartbeat_at = STATEMENT_TIMESTAMP()
FROM locked, req
WHERE c.job_id = locked.job_id AND req.job_id = c.job_id AND req.claim_id = c.claim_id
  AND c.job_agent_id = %(agent)s AND c.claim_expires_at > STATEMENT_TIMESTAMP()
RETURNING c.job_id, c.claim_expires_at, STATEMENT_TIMESTAMP()


-- name: claim_extend_if_current_many_in_workspace
-- The same, for jobs of %(workspace)s only.
WITH req AS (
    SELECT * FROM unnest(%(jobs)s::uuid[], %(claims)s::uuid[]) AS r(job_id, claim_id)
    WHERE r.job_id IN (SELECT id FROM job WHERE workspace_id = %(workspace)s)
), locked AS (
    SELECT c.job_id FROM job_claim c
    JOIN req ON req.job_id = c.job_id AND req.claim_id = c.claim_id
    WHERE c.job_agent_id = %(agent)s AND c.claim_expires_at > STATEMENT_TIMESTAMP()
    ORDER BY c.job_id
    FOR UPDATE OF c
)
UPDATE job_claim c
SET claim_expires_at = LEAST(STATEMENT_TIMESTAMP() + make_interval(secs => c.lease_seconds),
                             c.deadline_at),
    heartbeat_at = STATEMENT_TIMESTAMP()
FROM locked, req
WHERE c.job_id = locked.job_id AND req.job_id = c.job_id AND req.claim_id = c.claim_id
  AND c.job_agent_id = %(agent)s AND c.claim_expires_at > STATEMENT_TIMESTAMP()
RETURNING c.job_id, c.claim_expires_at, STATEMENT_TIMESTAMP()


-- name: checkpoint_save_if_current
-- Save %(data)s as the job's checkpoint if %(claim)s is its current claim, in the caller's
-- scope (%(agent)s, %(workspace)s; NULL: no such limit). The claim row is held FOR SHARE
-- until the caller's transaction ends, so a reap, release, report or operator transition
-- ending the claim waits for it, or it finds the claim gone and writes nothing. A row written
-- by an older attempt never replaces a newer attempt's. A row back: saved.
INSERT INTO job_checkpoint (job_id, claim_id, attempt, data, saved_at)
SELECT c.job_id, c.claim_id, c.attempt, %(data)s::jsonb, STATEMENT_TIMESTAMP()
FROM job_claim c
WHERE c.job_id = %(job)s AND c.claim_id = %(claim)s
  AND (%(agent)s::uuid IS NULL OR c.job_agent_id = %(agent)s::uuid)
  AND (%(workspace)s::uuid IS NULL
       OR c.job_id IN (SELECT id FROM job WHERE workspace_id = %(workspace)s::uuid))
FOR SHARE OF c
ON CONFLICT (job_id) DO UPDATE SET claim_id = EXCLUDED.claim_id, attempt = EXCLUDED.attempt,
    data = EXCLUDED.data, saved_at = EXCLUDED.saved_at
  WHERE job_checkpoint.attempt <= EXCLUDED.attempt
RETURNING job_id


-- name: claim_hold_if_current
-- The attempt of %(claim)s if it is the job's current claim and its deadline has not passed,
-- in the caller's scope (%(agent)s, %(workspace)s; NULL: no such limit), the claim row held
-- FOR SHARE until the caller's transaction ends: the effect ledger's guard
-- (lifecycle/effects.py), as checkpoint_save_if_current's. A reap, release, report or
-- operator transition ending the claim waits for the caller, or the caller finds the claim
-- gone. No row: not current.
SELECT c.attempt FROM job_claim c
WHERE c.job_id = %(job)s AND c.claim_id = %(claim)s
  AND (c.deadline_at IS NULL OR c.deadline_at > STATEMENT_TIMESTAMP())
  AND (%(agent)s::uuid IS NULL OR c.job_agent_id = %(agent)s::uuid)
  AND (%(workspace)s::uuid IS NULL
       OR c.job_id IN (SELECT id FROM job WHERE workspace_id = %(workspace)s::uuid))
FOR SHARE OF c


-- name: group_hold
-- Hold the group's row (FOR SHARE) until the caller commits: a cancel, which updates the row,
-- waits for the transactions that hold it, and they see it cancelled if it came first.
-- Answers (cancelled_at, finished_at), or no row for a group that does not exist.
SELECT cancelled_at, finished_at FROM job_group
WHERE workspace_id = %(workspace)s AND name = %(name)s
FOR SHARE


-- name: wake_notify
-- Wake-ups (jobqueue.wakeups): one NOTIFY per payload of %(payloads)s on %(channel)s,
-- delivered when the transaction commits.
SELECT pg_notify(%(channel)s, p) FROM unnest(%(payloads)s::text[]) AS p


-- name: clock_now
-- The database's clock.
SELECT STATEMENT_TIMESTAMP()


-- name: database_ping
-- The health check's round trip (/healthz).
SELECT 1


-- name: wake_listen
-- The wake-up hub's listener (jobqueue.wakeups.PgListener), on its own connection: the
-- channel is jobqueue.wakeups.CHANNEL.
LISTEN jobqueue_wake


-- name: function_define
-- Not run as written: the template of a hot statement's PL/pgSQL wrapper, for a server
-- reached through a transaction-mode pooler that cannot keep prepared statements
-- (JOBQUEUE_PREPARED_STATEMENTS=0; PgBouncer before 1.21). PL/pgSQL prepares the statement
-- inside the function once per server connection and keeps its plan there, whichever client
-- the pooler lends that connection to; a call is one short statement to plan. The
-- migrations fill it in (jobqueue/lifecycle/pg/functions.py) from the statement as the
-- backend runs it, its %(name)s parameters becoming the function's, in order of first use
-- ({parameters}, $1...: their types as PostgreSQL infers them), its columns the function's
-- result ({columns}: their names and types): the statement's text stays in one place, here.
-- {function} names the statement and the digest of its text; {digest} is the digest of the
-- whole definition (a change of the types it was made with is installed again).
-- A column of the result and a table column of the same name: the table's (use_column).
CREATE FUNCTION {function}({parameters}) RETURNS TABLE ({columns})
LANGUAGE plpgsql VOLATILE AS $jobqueue$
/* jobqueue wrapper {digest} */
#variable_conflict use_column
BEGIN
RETURN QUERY {statement};
END
$jobqueue$


-- name: function_call
-- Not run as written: a call of a statement's wrapper (function_define), the statement's own
-- %(name)s parameters as its arguments, in the function's order.
SELECT * FROM {function}({arguments})


-- name: function_drop
-- Not run as written: drop a wrapper (function_define) to define it again.
DROP FUNCTION IF EXISTS {function}


-- name: function_list_installed
-- Which of the wrappers %(names)s are installed, each with the digest of its definition.
SELECT p.proname::text, substring(p.prosrc from 'jobqueue wrapper ([0-9a-f]+)') FROM pg_proc p
WHERE p.pronamespace = current_schema()::regnamespace AND p.proname = ANY(%(names)s::text[])


-- name: function_list_all
-- Every wrapper (function_define) installed, whichever release defined it.
SELECT p.proname::text FROM pg_proc p
WHERE p.pronamespace = current_schema()::regnamespace
  AND p.prosrc LIKE '%%/* jobqueue wrapper %%'


-- name: function_type_names
-- The names of the types %(oids)s with their modifiers %(mods)s, in order (a wrapper's
-- parameters and columns).
SELECT format_type(t.oid, t.mod)
FROM unnest(%(oids)s::oid[], %(mods)s::integer[]) WITH ORDINALITY AS t(oid, mod, n)
ORDER BY t.n


-- name: job_settle_dependents
-- Settle the dependents of the jobs %(jobs)s that a transition other than a report just
-- ended with %(statuses)s (paired), in its transaction: jobqueue_settle_dependents (migration
-- 0021) for each of them that has dependents, in job_id order. The report statements call
-- the function themselves.
SELECT jobqueue_settle_dependents(r.id, r.status)
FROM unnest(%(jobs)s::uuid[], %(statuses)s::text[]) AS r(id, status)
JOIN job ON job.id = r.id
WHERE job.has_dependents
ORDER BY r.id
