# Rate limits (#29; docs/api.md "Rate limits"): rate_limit rows (PUT rate-limits/{key}),
# job.rate_limit_key and the internal rate_held (NULL for a plain job: no bytes in its row, no
# rewrite of the table), and the triggers that give a key's permits to its jobs.
#
# The design is the concurrency keys' admission (0027): a key's *permits* are used by its jobs
# claimed in the window (started_at, the latest claim, after now - period_seconds: a job
# counts once, by its latest claim) and by its queued jobs given one (rate_held NULL) that
# were not; its other queued jobs are held back (rate_held true), and a claim never takes a
# held job (claimrule's rate_permit; 0030 leaves them out of the claim indexes). A claim
# takes a job given a permit, so it moves that permit into the window: the claim path counts
# nothing, locks nothing extra and fires no trigger. Permits are given where they may free:
# when a job of the key enters the queue (it is held back, and may be given one at once),
# leaves it unclaimed (cancelled, expired, deleted), is given its concurrency slot (a job
# with both keys is given a permit only once it holds its slot: no permit waits on a slot
# while a slot waits on a permit), when the key's limit is set or removed
# (lifecycle/ratelimits.py), and when the window opens: jobqueue_rate_admit, finding no
# permit free for a job a claim could take, announces the key ('r:<workspace>:<key> <delay>')
# for the moment the oldest claim leaves the window (at the latest a period from now, when a
# permit is held by a queued job not claimed yet), and the wake-up hubs settle it then. The
# maintenance sweep settles every key with held jobs too (a key whose announcement nobody
# heard). A key without a rate_limit row limits nothing: its held jobs are all given one.
#
# Race-safe (PostgreSQL, READ COMMITTED): permits are given only under the key's advisory
# lock ('jobqueue.rate:<workspace>:<key>'), counted by statements that start after it was
# taken, so no two transactions give out the same permit; the triggers only try the lock and
# announce the key when another transaction holds it (no deadlock; 0027's reasoning). SQLite
# serializes its writers: its triggers give permits out at once, and, as they cannot announce,
# a claim of a job with a key settles the key afterwards (lifecycle/claim.py; on PostgreSQL
# too), which announces its window's opening. A hub that has no timer for a key with held
# jobs (it started listening after the announcement) settles it at its next re-check.

import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models

PG_FUNCTIONS = r"""
CREATE OR REPLACE FUNCTION jobqueue_rate_mark() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    -- BEFORE INSERT of a job with a rate limit key: a job created queued is held back until
    -- a permit is given to it (the AFTER trigger). An UPDATE is marked by the AFTER trigger
    -- (a BEFORE UPDATE row trigger would lock every plain job's row a report writes: 0027).
    IF NEW.status = 'queued' THEN
        NEW.rate_held := true;
    ELSE
        NEW.rate_held := NULL;
    END IF;
    RETURN NEW;
END
$fn$;

CREATE OR REPLACE FUNCTION jobqueue_rate_announce(ws uuid, rkey text, delay double precision)
RETURNS void LANGUAGE sql VOLATILE AS $fn$
-- 'r:<workspace>:<key>' on jobqueue_wake (escaped as 0027's concurrency keys), `delay`
-- seconds from now when > 0: the wake-up hubs settle the key then (jobqueue.wakeups).
SELECT pg_notify('jobqueue_wake', 'r:' || ws::text || ':'
    || replace(replace(rkey, chr(37), chr(37) || '25'), ' ', chr(37) || '20')
    || CASE WHEN delay > 0 THEN ' ' || round(delay::numeric, 3)::text ELSE '' END)
$fn$;

CREATE OR REPLACE FUNCTION jobqueue_rate_admit(ws uuid, rkey text) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $fn$
-- Give the key's free permits to its held-back jobs that a claim could take now (due, not
-- past expires_at, not a paused agent's own, holding their concurrency slot if they have a
-- key), in claim order; a key without a limit gives every held-back job one. The caller
-- holds the key's lock. Each job given a permit is announced to its waiters. When held-back
-- jobs remain and no permit is free, the key is announced for when the window opens.
-- Answers how many were given one.
DECLARE
    lim rate_limit;
    cutoff timestamptz;
    used integer;
    free integer;
    given integer := 0;
    opens timestamptz;
    h record;
BEGIN
    SELECT * INTO lim FROM rate_limit WHERE workspace_id = ws AND key = rkey;
    -- Permits held by queued jobs that cannot be claimed (a paused agent's own; a job whose
    -- concurrency slot was taken back) go back, passing over rows a claim in flight holds.
    UPDATE job SET rate_held = true WHERE id IN (
        SELECT id FROM job
        WHERE workspace_id = ws AND rate_limit_key = rkey AND status = 'queued'
          AND rate_held IS NULL
          AND (concurrency_held OR (label_set_id IS NULL AND job_agent_id IN (
              SELECT a.id FROM job_agent a WHERE a.paused_at IS NOT NULL)))
        FOR NO KEY UPDATE SKIP LOCKED);
    IF lim.key IS NULL THEN
        free := NULL;  -- no limit: every one
    ELSE
        cutoff := STATEMENT_TIMESTAMP() - make_interval(secs => lim.period_seconds);
        -- One statement, one snapshot: a claim that commits meanwhile moves its job from
        -- the permit holders into the window, and two statements could count it in neither.
        SELECT count(*) INTO used FROM job
        WHERE workspace_id = ws AND rate_limit_key = rkey
          AND (started_at > cutoff OR (status = 'queued' AND rate_held IS NULL));
        free := greatest(0, lim.count - used);
    END IF;
    IF free IS NULL OR free > 0 THEN
        FOR h IN
            SELECT id, job_agent_id, label_set_id FROM job
            WHERE workspace_id = ws AND rate_limit_key = rkey AND status = 'queued'
              AND rate_held AND concurrency_held IS NULL
              AND (lim.key IS NULL OR (available_at <= STATEMENT_TIMESTAMP()
                  AND (expires_at IS NULL OR expires_at > STATEMENT_TIMESTAMP())
                  AND (label_set_id IS NOT NULL OR NOT EXISTS (
                      SELECT 1 FROM job_agent a WHERE a.id = job.job_agent_id
                        AND a.paused_at IS NOT NULL))))
            ORDER BY priority DESC, available_at, created_at
            LIMIT free
            FOR NO KEY UPDATE SKIP LOCKED
        LOOP
            UPDATE job SET rate_held = NULL WHERE id = h.id;
            PERFORM pg_notify('jobqueue_wake',
                CASE WHEN h.label_set_id IS NULL THEN 'a:' || h.job_agent_id::text
                     ELSE 'l:' || ws::text || ':'
                          || (SELECT s.key FROM job_label_set s WHERE s.id = h.label_set_id) END);
            given := given + 1;
        END LOOP;
    END IF;
    IF lim.key IS NOT NULL AND given >= free THEN
        -- No permit left: if a held-back job waits (due or not), the key is settled again
        -- when the window opens: the oldest claim in it leaves, or, when only queued jobs
        -- hold its permits, a period from now (none of their claims can leave before).
        IF EXISTS (SELECT 1 FROM job WHERE workspace_id = ws AND rate_limit_key = rkey
                   AND status = 'queued' AND rate_held) THEN
            SELECT coalesce(min(started_at), STATEMENT_TIMESTAMP())
                   + make_interval(secs => lim.period_seconds) INTO opens
            FROM job WHERE workspace_id = ws AND rate_limit_key = rkey AND started_at > cutoff;
            PERFORM jobqueue_rate_announce(
                ws, rkey, greatest(0.001, extract(epoch FROM opens - STATEMENT_TIMESTAMP())));
        END IF;
    ELSIF lim.key IS NOT NULL THEN
        -- A permit free and no job a claim could take now: the first held-back one to become
        -- due, if any, is announced for then.
        SELECT min(available_at) INTO opens FROM job
        WHERE workspace_id = ws AND rate_limit_key = rkey AND status = 'queued' AND rate_held
          AND available_at > STATEMENT_TIMESTAMP();
        IF opens IS NOT NULL THEN
            PERFORM jobqueue_rate_announce(
                ws, rkey, greatest(0.001, extract(epoch FROM opens - STATEMENT_TIMESTAMP())));
        END IF;
    END IF;
    RETURN given;
END
$fn$;

CREATE OR REPLACE FUNCTION jobqueue_rate_try(ws uuid, rkey text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $fn$
-- Take the key's lock if no one holds it, and then give its free permits out: true. False:
-- another transaction holds it (nothing done; the caller announces the key).
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtextextended(
            'jobqueue.rate:' || ws::text || ':' || rkey, 0)) THEN
        RETURN false;
    END IF;
    PERFORM jobqueue_rate_admit(ws, rkey);
    RETURN true;
END
$fn$;

CREATE OR REPLACE FUNCTION jobqueue_rate_changed() RETURNS trigger
LANGUAGE plpgsql AS $fn$
-- AFTER a job of a key entered or left the queue (or moved its available_at while queued, or
-- was given its concurrency slot): mark it (held back in the queue, else nothing), then give
-- the key's free permits out, or, when another transaction holds the key's lock, announce the
-- key (the hubs settle it once this transaction committed).
DECLARE
    j job;
BEGIN
    IF TG_OP = 'DELETE' THEN j := OLD; ELSE j := NEW; END IF;
    IF TG_OP = 'UPDATE' AND TG_ARGV[0] = 'moved' THEN
        IF NEW.status = 'queued' THEN
            UPDATE job SET rate_held = true WHERE id = NEW.id AND rate_held IS NULL;
        ELSIF NEW.rate_held THEN
            UPDATE job SET rate_held = NULL WHERE id = NEW.id;
        END IF;
    END IF;
    IF NOT jobqueue_rate_try(j.workspace_id, j.rate_limit_key) THEN
        PERFORM jobqueue_rate_announce(j.workspace_id, j.rate_limit_key, 0);
    END IF;
    RETURN NULL;
END
$fn$;

CREATE TRIGGER job_rate_mark_insert BEFORE INSERT ON job FOR EACH ROW
    WHEN (NEW.rate_limit_key IS NOT NULL)
    EXECUTE FUNCTION jobqueue_rate_mark();
CREATE TRIGGER job_rate_inserted AFTER INSERT ON job FOR EACH ROW
    WHEN (NEW.rate_limit_key IS NOT NULL AND NEW.status = 'queued')
    EXECUTE FUNCTION jobqueue_rate_changed('inserted');
CREATE TRIGGER job_rate_moved AFTER UPDATE OF status, available_at ON job FOR EACH ROW
    WHEN (NEW.rate_limit_key IS NOT NULL
          AND ((OLD.status IS DISTINCT FROM NEW.status
                AND NOT (OLD.status = 'queued' AND NEW.status = 'in_progress')
                AND (NEW.status = 'queued' OR OLD.status = 'queued'))
               OR (NEW.status = 'queued' AND OLD.status = 'queued'
                   AND OLD.available_at IS DISTINCT FROM NEW.available_at)))
    EXECUTE FUNCTION jobqueue_rate_changed('moved');
CREATE TRIGGER job_rate_slotted AFTER UPDATE OF concurrency_held ON job FOR EACH ROW
    WHEN (NEW.rate_limit_key IS NOT NULL AND NEW.status = 'queued' AND NEW.rate_held
          AND OLD.concurrency_held AND NEW.concurrency_held IS NULL)
    EXECUTE FUNCTION jobqueue_rate_changed('slotted');
CREATE TRIGGER job_rate_deleted AFTER DELETE ON job FOR EACH ROW
    WHEN (OLD.rate_limit_key IS NOT NULL AND OLD.rate_held IS NULL AND OLD.status = 'queued')
    EXECUTE FUNCTION jobqueue_rate_changed('deleted');
"""

PG_DROP = """
DROP TRIGGER IF EXISTS job_rate_mark_insert ON job;
DROP TRIGGER IF EXISTS job_rate_inserted ON job;
DROP TRIGGER IF EXISTS job_rate_moved ON job;
DROP TRIGGER IF EXISTS job_rate_slotted ON job;
DROP TRIGGER IF EXISTS job_rate_deleted ON job;
DROP FUNCTION IF EXISTS jobqueue_rate_changed();
DROP FUNCTION IF EXISTS jobqueue_rate_try(uuid, text);
DROP FUNCTION IF EXISTS jobqueue_rate_admit(uuid, text);
DROP FUNCTION IF EXISTS jobqueue_rate_announce(uuid, text, double precision);
DROP FUNCTION IF EXISTS jobqueue_rate_mark();
"""

# SQLite's clock, as jobqueue/sql/sqlite.sql writes it (a literal % doubled).
SQLITE_NOW = "STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')"


def sqlite_admit(workspace: str, key: str) -> str:
    """SQLite's jobqueue_rate_admit for a key (SQL expressions: NEW.workspace_id and
    NEW.rate_limit_key in a trigger), one statement: of the key's held-back jobs a claim could
    take now (due, not past expires_at, not a paused agent's, holding their concurrency slot),
    in claim order, as many as the key has free permits are given one (all of them, due or
    not, for a key without a limit). jobqueue/sql/sqlite.sql's rate_admit is this statement
    for parameters (tests/integration/core/test_rate_limits.py holds them equal)."""
    limit = (f"(SELECT r.count AS n, r.period_seconds AS p FROM rate_limit r "
             f"WHERE r.workspace_id = {workspace} AND r.key = {key})")
    cutoff = (f"STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW', '-' || "
              f"(SELECT p FROM {limit}) || ' seconds')")
    used = (f"(SELECT count(*) FROM job WHERE workspace_id = {workspace} "
            f"AND rate_limit_key = {key} AND ((started_at IS NOT NULL AND started_at > {cutoff}) "
            f"OR (status = 'queued' AND rate_held IS NULL)))")
    free = (f"(SELECT CASE WHEN count(*) = 0 THEN -1 ELSE max(0, min(n) - {used}) END "
            f"FROM {limit})")
    ready = (f"(NOT EXISTS {limit} OR (available_at <= {SQLITE_NOW} "
             f"AND (expires_at IS NULL OR expires_at > {SQLITE_NOW}) "
             f"AND (label_set_id IS NOT NULL OR job_agent_id NOT IN "
             f"(SELECT id FROM job_agent WHERE paused_at IS NOT NULL))))")
    return (f"UPDATE job SET rate_held = NULL WHERE id IN (SELECT id FROM job "
            f"WHERE workspace_id = {workspace} AND rate_limit_key = {key} "
            f"AND status = 'queued' AND rate_held AND concurrency_held IS NULL AND {ready} "
            f"ORDER BY priority DESC, available_at, created_at LIMIT {free})")


def _sqlite_admit(row: str) -> str:
    return sqlite_admit(f"{row}.workspace_id", f"{row}.rate_limit_key") + ";"


SQLITE_TRIGGERS = [
    "CREATE TRIGGER job_rate_inserted AFTER INSERT ON job "
    "WHEN NEW.rate_limit_key IS NOT NULL AND NEW.status = 'queued' BEGIN "
    "UPDATE job SET rate_held = 1 WHERE id = NEW.id; " + _sqlite_admit("NEW") + " END",
    "CREATE TRIGGER job_rate_moved AFTER UPDATE OF status, available_at ON job "
    "WHEN NEW.rate_limit_key IS NOT NULL AND ((OLD.status IS NOT NEW.status "
    "AND NOT (OLD.status = 'queued' AND NEW.status = 'in_progress') "
    "AND (NEW.status = 'queued' OR OLD.status = 'queued')) "
    "OR (NEW.status = 'queued' AND OLD.status = 'queued' "
    "AND OLD.available_at IS NOT NEW.available_at)) BEGIN "
    "UPDATE job SET rate_held = CASE WHEN NEW.status = 'queued' THEN 1 END "
    "WHERE id = NEW.id; " + _sqlite_admit("NEW") + " END",
    "CREATE TRIGGER job_rate_slotted AFTER UPDATE OF concurrency_held ON job "
    "WHEN NEW.rate_limit_key IS NOT NULL AND NEW.status = 'queued' AND NEW.rate_held "
    "AND OLD.concurrency_held AND NEW.concurrency_held IS NULL BEGIN "
    + _sqlite_admit("NEW") + " END",
    "CREATE TRIGGER job_rate_deleted AFTER DELETE ON job "
    "WHEN OLD.rate_limit_key IS NOT NULL AND OLD.rate_held IS NULL "
    "AND OLD.status = 'queued' BEGIN " + _sqlite_admit("OLD") + " END",
]
SQLITE_DROP = ["DROP TRIGGER IF EXISTS job_rate_inserted",
               "DROP TRIGGER IF EXISTS job_rate_moved",
               "DROP TRIGGER IF EXISTS job_rate_slotted",
               "DROP TRIGGER IF EXISTS job_rate_deleted"]


def _concurrency_inserted():
    """0027's SQLite trigger job_concurrency_inserted (SQLite fires a row's triggers newest
    first: made again after job_rate_inserted, it marks and admits a job's slot first, so that
    the rate admit sees whether the job holds it)."""
    import importlib

    m = importlib.import_module("jobqueue.migrations.0027_job_concurrency_keys")
    return next(t for t in m.SQLITE_TRIGGERS if "job_concurrency_inserted " in t)


def add_triggers(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_FUNCTIONS)
    else:
        for statement in SQLITE_TRIGGERS:
            schema_editor.execute(statement)
        schema_editor.execute("DROP TRIGGER IF EXISTS job_concurrency_inserted")
        schema_editor.execute(_concurrency_inserted())


def drop_triggers(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_DROP)
    else:
        for statement in SQLITE_DROP:
            schema_editor.execute(statement)


class Migration(migrations.Migration):

    dependencies = [
        ("jobqueue", "0028_job_concurrency_indexes"),
    ]

    operations = [
        migrations.CreateModel(
            name="RateLimit",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False,
                                           verbose_name="ID")),
                ("key", models.CharField(max_length=255)),
                ("count", models.PositiveIntegerField()),
                ("period_seconds", models.PositiveIntegerField()),
                ("created_at", models.DateTimeField(
                    db_default=django.db.models.functions.datetime.Now(), editable=False)),
                ("updated_at", models.DateTimeField(
                    db_default=django.db.models.functions.datetime.Now())),
                ("workspace", models.ForeignKey(
                    db_index=False, on_delete=django.db.models.deletion.CASCADE,
                    related_name="+", to="jobqueue.workspace")),
            ],
            options={"db_table": "rate_limit", "ordering": ["key"]},
        ),
        migrations.AddConstraint(
            model_name="ratelimit",
            constraint=models.UniqueConstraint(fields=("workspace", "key"),
                                               name="rate_limit_key_unique"),
        ),
        migrations.AddField(
            model_name="job",
            name="rate_limit_key",
            field=models.CharField(blank=True, editable=False, max_length=255, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="rate_held",
            field=models.BooleanField(blank=True, editable=False, null=True),
        ),
        migrations.RunPython(add_triggers, drop_triggers),
    ]
