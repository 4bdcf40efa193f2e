"""The PostgreSQL statements of the hot paths, one per transition, named verb-first.

Each is a fixed text with named parameters, prepared once per connection (pg/cursor.py), so
its text never varies with the values: optional values are NULL ("not given"), and where a
condition would change the plan (which rows are locked, a join) the variant is its own
named statement. Every guard is in the WHERE of the statement that writes; every time is the
statement's (STATEMENT_TIMESTAMP()).

Lock order, as everywhere in the lifecycle: a job row first, then its claim row. Claims and
reports lock job rows FOR NO KEY UPDATE (what their UPDATE takes anyway), never FOR UPDATE:
a foreign-key check's KEY SHARE lock (an event inserted for a job) must not make a claim skip
a job or a report wait. Batches lock their rows in job_id order, as the reaper does.

The job's columns are named (JOB_COLUMNS), never `job.*`: a prepared `RETURNING job.*` fails
("cached plan must not change result type") on every connection after a migration adds a
column to `job`.
"""

import functools

from jobqueue import wakeups
from jobqueue.history import MESSAGE_CHARS
from jobqueue.models import Job

JOB_COLUMNS = ", ".join(f'job."{f.column}"' for f in Job._meta.concrete_fields)

# --- claims ---------------------------------------------------------------------------------

# The attempt's deadline (job_claim.deadline_at), from a claimed row: the earlier of the
# runtime limit and the job's expires_at; LEAST ignores a NULL (no such clock), and is NULL
# with neither. The lease is capped at it (here and by heartbeats).
_DEADLINE = ("LEAST(STATEMENT_TIMESTAMP() + make_interval(secs => max_runtime_seconds), "
             "expires_at)")

# After the locked CTE: the gate (the agent is not paused), the guarded UPDATE (status still
# 'queued'), then the claim rows and the events, all from the rows that UPDATE returned;
# answered in claim order, each with the checkpoint an earlier attempt saved
# (job_checkpoint), if any.
#
# The gate reads the agent's paused_at under FOR SHARE, and only when there is a job to hand
# out (an empty poll locks nothing). A pause is an UPDATE of that row: it waits for the
# claims that hold the share lock, and a claim that meets the pause's lock waits for it and
# then re-reads the row (READ COMMITTED re-checks a locked row's WHERE), so no claim hands
# out a job once a pause has committed. The foreign-key check of the claim row takes a KEY
# SHARE lock on the same row anyway.
_CLAIM_LOCKED = """
), gate AS MATERIALIZED (
    SELECT job_agent.id FROM job_agent
    WHERE job_agent.id = %(agent)s AND job_agent.paused_at IS NULL
      AND EXISTS (SELECT 1 FROM locked)
    FOR SHARE
), claimed AS (
    UPDATE job SET status = 'in_progress', attempt = job.attempt + 1,
        last_claim_id = gen_random_uuid(), started_at = STATEMENT_TIMESTAMP(),
        updated_at = STATEMENT_TIMESTAMP()
    FROM locked, gate WHERE job.id = locked.id AND job.status = 'queued'
    RETURNING """ + JOB_COLUMNS + """
), claims AS (
    INSERT INTO job_claim (job_id, job_agent_id, claim_id, attempt, lease_seconds, claimed_at,
                           claim_expires_at, deadline_at, holder, idempotency_key)
    SELECT id, job_agent_id, last_claim_id, attempt, %(lease)s, STATEMENT_TIMESTAMP(),
           LEAST(STATEMENT_TIMESTAMP() + make_interval(secs => %(lease)s), """ + _DEADLINE + """),
           """ + _DEADLINE + """, %(holder)s, %(key)s
    FROM claimed
), events AS (
    INSERT INTO job_event (job_id, kind, attempt, actor, claim_id, detail, created_at, holder)
    SELECT id, %(kind)s, attempt, %(actor)s, last_claim_id, %(detail)s::jsonb,
           STATEMENT_TIMESTAMP(), %(holder)s
    FROM claimed
)
SELECT claimed.*, STATEMENT_TIMESTAMP() AS db_now, ck.data AS checkpoint
FROM claimed LEFT JOIN job_checkpoint ck ON ck.job_id = claimed.id
ORDER BY priority DESC, available_at, created_at
"""

# JobClaimAvailable: claim up to %(limit)s of the agent's claimable jobs, in claim order,
# skipping the rows other claimers hold. The locking SELECT is the ORM's
# Job.objects.claimable().in_claim_order() (pinned by tests/integration/core/test_pg_fastpath)
# in a MATERIALIZED CTE, evaluated exactly once: never `IN (SELECT ... LIMIT n FOR UPDATE)`.
# Served by job_claim_order_idx without a sort.
JOB_CLAIM_AVAILABLE = """
WITH locked AS MATERIALIZED (
    SELECT id FROM job
    WHERE job_agent_id = %(agent)s
      AND (expires_at IS NULL OR expires_at > STATEMENT_TIMESTAMP())
      AND available_at <= STATEMENT_TIMESTAMP() AND status = 'queued'
    ORDER BY priority DESC, available_at, created_at
    LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED""" + _CLAIM_LOCKED

# JobClaimNext / JobClaimUpTo(n): the statement above with its LIMIT written in the text, one
# text per batch size up to LITERAL_LIMITS (n is an int the caller validated,
# 1..JOBQUEUE_MAX_CLAIM_BATCH). With the limit a parameter, PostgreSQL's plan cache cannot
# price a generic plan (it assumes a tenth of the table): it plans the whole statement on
# every execution (0.3 ms of server time, a quarter of a batch claim's cost in a raw loop) or,
# on a small table, keeps a generic plan that joins the UPDATE to a sequential scan of `job`.
# With the limit in the text the generic plan is the index-only one, and the cache keeps it
# after its first five executions (docs/performance.md, "Prepared statements";
# tests/integration/core/test_pg_fastpath). The reference agent asks for as many jobs as it
# has free slots, so one connection sees several sizes: a text each up to LITERAL_LIMITS
# (psycopg keeps at most 100 prepared statements a connection, evicting the oldest), and the
# parameter beyond, where a batch that large amortizes its planning.
LITERAL_LIMITS = 32


@functools.cache
def job_claim_up_to(limit: int) -> str:
    if limit > LITERAL_LIMITS:
        return JOB_CLAIM_AVAILABLE
    return JOB_CLAIM_AVAILABLE.replace("LIMIT %(limit)s", f"LIMIT {int(limit):d}")


JOB_CLAIM_NEXT = job_claim_up_to(1)

# JobClaimAvailableById: the same for one named job (no row when it is not claimable now).
JOB_CLAIM_AVAILABLE_BY_ID = """
WITH locked AS MATERIALIZED (
    SELECT id FROM job
    WHERE id = %(job)s AND job_agent_id = %(agent)s
      AND (expires_at IS NULL OR expires_at > STATEMENT_TIMESTAMP())
      AND available_at <= STATEMENT_TIMESTAMP() AND status = 'queued'
    FOR NO KEY UPDATE SKIP LOCKED""" + _CLAIM_LOCKED

# JobClaimAvailableByIdAtAttempt: the same, only while the job's attempt is %(expected)s.
JOB_CLAIM_AVAILABLE_BY_ID_AT_ATTEMPT = """
WITH locked AS MATERIALIZED (
    SELECT id FROM job
    WHERE id = %(job)s AND job_agent_id = %(agent)s AND attempt = %(expected)s
      AND (expires_at IS NULL OR expires_at > STATEMENT_TIMESTAMP())
      AND available_at <= STATEMENT_TIMESTAMP() AND status = 'queued'
    FOR NO KEY UPDATE SKIP LOCKED""" + _CLAIM_LOCKED

# --- reports --------------------------------------------------------------------------------

# The caller's scope: an agent's token sees its own jobs, a workspace key its workspace's
# (NULL: no such limit). The job row is found by its primary key, so these only filter it.
# No clock has ended the attempt (its deadline, job_claim.deadline_at, from the job's own
# columns: started_at is the claim's time): the holder's writes after it are refused.
_WITHIN_DEADLINE = """
      AND ({j}.max_runtime_seconds IS NULL
           OR {j}.started_at + make_interval(secs => {j}.max_runtime_seconds)
              > STATEMENT_TIMESTAMP())
      AND ({j}.expires_at IS NULL OR {j}.expires_at > STATEMENT_TIMESTAMP())"""
_REPORT_GUARD = """
    WHERE job.id = %(job)s AND job.status = 'in_progress' AND job.last_claim_id = %(claim)s
      AND (%(agent)s::uuid IS NULL OR job.job_agent_id = %(agent)s)
      AND (%(workspace)s::uuid IS NULL OR job.workspace_id = %(workspace)s)""" + \
    _WITHIN_DEADLINE.format(j="job")

# message, result and external_id: NULL keeps the job's value (the field was not given).
_REPORT_FIELDS = """
        message = COALESCE(%(message)s, job.message),
        result = COALESCE(%(result)s::jsonb, job.result),
        external_id = COALESCE(%(external_id)s, job.external_id),"""

_REPORT_EVENT = """
    INSERT INTO job_event (job_id, kind, attempt, actor, claim_id, detail, created_at)
    SELECT id, %(kind)s, attempt, %(actor)s, %(claim)s, %(detail)s::jsonb, STATEMENT_TIMESTAMP()
    FROM done
)"""

# The webhook outbox (lifecycle/finished.py): one pending delivery per ended job and endpoint of
# its workspace that wants job.finished (events empty: all), in the report's own statement,
# its body fixed there: finished.job_payload(job_document(the job as `done` returns it)), times
# as Python's isoformat() with a Z (no fraction when it is zero).
_JSON_TIME = ("""regexp_replace(to_char({} AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US'), """
              r"""'\.000000$', '') || 'Z'""")
_OUTBOX = """
    INSERT INTO webhook_delivery (id, endpoint_id, job_id, created_at, payload)
    SELECT d.id, d.endpoint_id, d.job_id, STATEMENT_TIMESTAMP(), jsonb_build_object(
        'id', d.id, 'event', 'job.finished',
        'created_at', """ + _JSON_TIME.format("STATEMENT_TIMESTAMP()") + """, 'job', d.job)
    FROM (SELECT gen_random_uuid() AS id, e.id AS endpoint_id, done.id AS job_id,
                 jsonb_build_object(
                     'id', done.id, 'workspace_id', done.workspace_id,
                     'job_agent_id', done.job_agent_id, 'status', done.status,
                     'job_agent_config', done.job_agent_config, 'result', done.result,
                     'message', done.message, 'external_id', done.external_id,
                     'attempt', done.attempt, 'max_attempts', done.max_attempts,
                     'priority', done.priority,
                     'available_at', """ + _JSON_TIME.format("done.available_at") + """,
                     'created_at', """ + _JSON_TIME.format("done.created_at") + """,
                     'started_at', """ + _JSON_TIME.format("done.started_at") + """,
                     'completed_at', """ + _JSON_TIME.format("done.completed_at") + """,
                     'updated_at', """ + _JSON_TIME.format("done.updated_at") + """,
                     'idempotency_key', done.idempotency_key) AS job
          FROM done JOIN webhook_endpoint e ON e.workspace_id = done.workspace_id
          WHERE done.status IN ('successful', 'failure', 'cancelled', 'expired')
            AND (e.events = '[]'::jsonb OR jsonb_exists(e.events, 'job.finished'))) d
)"""

# A successful report publishes its claim's staged artifacts (jobqueue/lifecycle/artifacts.py)
# in its own statement, and unpublishes an earlier set (a job requeued after a success).
_PUBLISH = """
    UPDATE job_artifact a SET published_at = CASE
        WHEN a.claim_id = %(CLAIM)s AND a.state = 'staged' THEN STATEMENT_TIMESTAMP() END
    FROM done WHERE a.job_id = done.id AND done.status = 'successful'
      AND ((a.claim_id = %(CLAIM)s AND a.state = 'staged') OR a.published_at IS NOT NULL)"""

# JobSetStateIfRunning: end the job with a terminal status if %(claim)s is still its claim.
# The UPDATE locks the job row and requires the claim row (same claim_id) in its WHERE; the
# claim row is then deleted from the UPDATE's rows (locked second). claims_deleted is 1.
# A terminal report tells the producers waiting for its jobs (jobqueue.wakeups) in the same
# statement: NOTIFY is delivered on commit. The CTE runs because the final SELECT counts it.
# Only for a job a producer waits for (job.watched, set before the wait's first check, under
# the job row's lock order): a NOTIFY serializes commits cluster-wide, which cost the core
# cycle 15-30 % at 16 workers when every report sent one.
_NOTIFY_ENDED = """
    SELECT pg_notify('""" + wakeups.CHANNEL + """', 'j:' || done.id::text) FROM done
    WHERE done.watched
)"""

# The end of a report's UPDATE of the job row (its guards, the claim row in its WHERE) and the
# deletion of that claim row, shared by the final and the retryable report. The deletion names the
# job's id as well as `done`'s: with only the join, the generic plan of a connection that
# prepared it while job_claim was small and unanalysed scanned the whole table for the claim_id
# on every report (tests/integration/core/test_pg_fastpath).
_END_CLAIM = """        updated_at = STATEMENT_TIMESTAMP()
    FROM job_claim c""" + _REPORT_GUARD + """
      AND c.job_id = job.id AND c.claim_id = %(claim)s
    RETURNING """ + JOB_COLUMNS + """
), gone AS (
    DELETE FROM job_claim c USING done
    WHERE c.job_id = %(job)s AND c.job_id = done.id AND c.claim_id = %(claim)s
    RETURNING c.job_id"""

JOB_SET_STATE_IF_RUNNING = """
WITH done AS (
    UPDATE job SET status = %(status)s, completed_at = STATEMENT_TIMESTAMP(),""" + \
    _REPORT_FIELDS + """
""" + _END_CLAIM + """
), published AS (""" + _PUBLISH.replace("%(CLAIM)s", "%(claim)s") + """
), event AS (""" + _REPORT_EVENT + """, hook AS (""" + _OUTBOX + """, notified AS (""" + \
    _NOTIFY_ENDED + """
SELECT done.*, (SELECT count(*) FROM gone) AS claims_deleted
FROM done CROSS JOIN (SELECT count(*) FROM notified) AS n
"""

# A retryable failure: while attempts remain ({again}) the job goes back to 'queued',
# claimable after the backoff: retry_backoff_seconds (NULL: %(backoff)s) doubled per attempt
# made, at most %(backoff_cap)s, shortened by up to %(jitter)s of itself; else it ends with
# {status} as any final report. The time is the statement's, never the app server's.
_RETRY_SET = """
        status = CASE WHEN {again} THEN 'queued' ELSE {status} END,
        completed_at = CASE WHEN {again} THEN NULL ELSE STATEMENT_TIMESTAMP() END,
        available_at = CASE WHEN {again} THEN STATEMENT_TIMESTAMP() + make_interval(secs =>
            LEAST(%(backoff_cap)s::float8, COALESCE(job.retry_backoff_seconds, %(backoff)s)
                  * power(2::float8, job.attempt - 1)) * (1 - %(jitter)s::float8 * random()))
            ELSE job.available_at END,"""

# JobFailOrRetryIfRunning: a retryable failure ({"status": "failure", "retry": true}) if
# %(claim)s is still the job's claim: queued after the backoff, or failure on the last
# attempt; the claim row goes as on JobSetStateIfRunning. The event says which (requeued).
JOB_FAIL_OR_RETRY_IF_RUNNING = """
WITH done AS (
    UPDATE job SET""" + _RETRY_SET.format(
        again="job.attempt < job.max_attempts", status="'failure'") + \
    _REPORT_FIELDS + """
""" + _END_CLAIM + """
), event AS (
    INSERT INTO job_event (job_id, kind, attempt, actor, claim_id, detail, created_at)
    SELECT id, %(kind)s, attempt, %(actor)s, %(claim)s,
           %(detail)s::jsonb || jsonb_build_object('requeued', status = 'queued'),
           STATEMENT_TIMESTAMP()
    FROM done
), hook AS (""" + _OUTBOX + """, notified AS (""" + _NOTIFY_ENDED + """
SELECT done.*, (SELECT count(*) FROM gone) AS claims_deleted
FROM done CROSS JOIN (SELECT count(*) FROM notified) AS n
"""

# JobSetProgressIfRunning: record progress (message, result, external_id) if %(claim)s is
# still the job's claim. Never touches the lease.
JOB_SET_PROGRESS_IF_RUNNING = """
WITH done AS (
    UPDATE job SET""" + _REPORT_FIELDS + """
        updated_at = STATEMENT_TIMESTAMP()""" + _REPORT_GUARD + """
    RETURNING """ + JOB_COLUMNS + """
), event AS (""" + _REPORT_EVENT + """
SELECT done.* FROM done
"""

# JobSetStateIfRunningMany: end every job of the batch whose claim is current, one statement.
# It locks each job row and then its claim row in job_id order (the order of batch
# heartbeats and the reaper, job row first as everywhere), so batches never deadlock each
# other or them; the UPDATE repeats every guard of the single report. FOR NO KEY UPDATE, not
# FOR UPDATE: a transaction whose deferred foreign-key check at COMMIT takes KEY SHARE on
# these rows (an event inserted for a job it does not lock, e.g. a recorded refusal) must not
# wait on them while holding a row this statement waits for. %(messages)s, %(results)s and
# %(external_ids)s may be NULL (a plain acknowledgement binds three arrays): unnest pads them.
# So may %(retries)s (no report asks a retry); a true one is a retryable failure (_RETRY_SET).
JOB_SET_STATE_IF_RUNNING_MANY = """
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
      AND j.last_claim_id = req.claim_id""" + _WITHIN_DEADLINE.format(j="j") + """
    ORDER BY j.id
    FOR NO KEY UPDATE OF j FOR UPDATE OF c
), done AS (
    UPDATE job SET""" + _RETRY_SET.format(
        again="(req.retry AND job.attempt < job.max_attempts)", status="req.status") + """
        message = COALESCE(req.message, job.message),
        result = COALESCE(req.result::jsonb, job.result),
        external_id = COALESCE(req.external_id, job.external_id),
        updated_at = STATEMENT_TIMESTAMP()
    FROM locked JOIN req ON req.job_id = locked.id
    WHERE job.id = locked.id AND job.status = 'in_progress' AND job.last_claim_id = req.claim_id
""" + _WITHIN_DEADLINE.format(j="job") + """
    RETURNING """ + JOB_COLUMNS + """
), gone AS (
    DELETE FROM job_claim c USING done
    WHERE c.job_id = done.id AND c.claim_id = done.last_claim_id
    RETURNING c.job_id
), published AS (""" + _PUBLISH.replace("%(CLAIM)s", "done.last_claim_id") + """
), events AS (
    INSERT INTO job_event (job_id, kind, attempt, actor, claim_id, detail, created_at)
    SELECT done.id, %(kind)s, done.attempt, %(actor)s, done.last_claim_id,
           jsonb_build_object('status', req.status, 'has_result', req.result IS NOT NULL)
           || CASE WHEN req.retry THEN jsonb_build_object('retry', true,
                   'requeued', done.status = 'queued') ELSE '{}'::jsonb END
           || CASE WHEN req.message <> '' THEN jsonb_build_object('message',
                   left(req.message, """ + str(MESSAGE_CHARS) + """)) ELSE '{}'::jsonb END,
           STATEMENT_TIMESTAMP()
    FROM done JOIN req ON req.job_id = done.id
), hook AS (""" + _OUTBOX + """, notified AS (""" + _NOTIFY_ENDED + """
SELECT done.id, done.status, done.completed_at, done.workspace_id, (SELECT count(*) FROM gone)
FROM done CROSS JOIN (SELECT count(*) FROM notified) AS n
"""

# --- heartbeats (job_claim only, never job) ---------------------------------------------------

# The lease never runs past the attempt's deadline (LEAST ignores a NULL deadline_at).
_CLAIM_EXTEND = """
UPDATE job_claim
SET claim_expires_at = LEAST(STATEMENT_TIMESTAMP() + make_interval(secs => lease_seconds),
                             deadline_at),
    heartbeat_at = STATEMENT_TIMESTAMP()
WHERE job_id = %(job)s AND claim_id = %(claim)s AND claim_expires_at > STATEMENT_TIMESTAMP()
  AND (%(agent)s::uuid IS NULL OR job_agent_id = %(agent)s)
"""
_CLAIM_EXTENDED = "RETURNING claim_expires_at, STATEMENT_TIMESTAMP()\n"

# ClaimExtendIfCurrent: extend the lease to now + lease_seconds if %(claim)s is the job's
# claim and its lease has not expired (a heartbeat never revives an expired lease).
CLAIM_EXTEND_IF_CURRENT = _CLAIM_EXTEND + _CLAIM_EXTENDED

# ClaimExtendIfCurrentInWorkspace: the same, for a job of %(workspace)s only.
CLAIM_EXTEND_IF_CURRENT_IN_WORKSPACE = (
    _CLAIM_EXTEND + "  AND job_id IN (SELECT id FROM job WHERE workspace_id = %(workspace)s)\n"
    + _CLAIM_EXTENDED
)

_CLAIM_EXTEND_MANY = """
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
"""

# ClaimExtendIfCurrentMany: renew every claim of the batch that is the agent's, current and
# unexpired; the claim rows are locked in job_id order (as the reaper locks them) first.
CLAIM_EXTEND_IF_CURRENT_MANY = """
WITH req AS (
    SELECT * FROM unnest(%(jobs)s::uuid[], %(claims)s::uuid[]) AS r(job_id, claim_id)""" + \
    _CLAIM_EXTEND_MANY

# ClaimExtendIfCurrentManyInWorkspace: the same, for jobs of %(workspace)s only.
CLAIM_EXTEND_IF_CURRENT_MANY_IN_WORKSPACE = """
WITH req AS (
    SELECT * FROM unnest(%(jobs)s::uuid[], %(claims)s::uuid[]) AS r(job_id, claim_id)
    WHERE r.job_id IN (SELECT id FROM job WHERE workspace_id = %(workspace)s)""" + \
    _CLAIM_EXTEND_MANY
