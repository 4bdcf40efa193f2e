# Concurrency keys (#29; docs/api.md "Concurrency keys"): job.concurrency_key,
# concurrency_limit and the internal concurrency_held (all NULL for a plain job: no bytes in
# its row, no rewrite of the table), and the triggers that give a key's slots to its jobs.
#
# The design: a key's *slots* are held by its jobs that are in progress and by its queued
# jobs that were given one (concurrency_held NULL); its other queued jobs are held
# (concurrency_held true), and a claim never takes a held job (claimrule's concurrency_slot;
# 0028 leaves them out of the claim indexes, so a claim does not even read them). A claim
# takes a job that holds a slot, so it changes no count and takes no lock: the claim path is
# the plain one. Slots change hands where the count changes: when a job of the key enters the
# queue (created, released by its dependencies, requeued, retried: it becomes held, then may
# be given a slot at once) and when one leaves the queue or its run (reported, released,
# reaped, cancelled, expired, deleted). There the AFTER trigger gives the key's free slots to
# its held jobs in claim order (jobqueue_concurrency_admit): a held job gets one while the
# key's slot holders are fewer than its own limit; the first that does not fit stops it (the
# key's claim order holds). A job given a slot is announced to its waiters (its route's
# wake-up key, as a queued job's is).
#
# Race-safe (PostgreSQL, READ COMMITTED): slots are given only under the key's advisory lock,
# counted by a statement that starts after the lock was taken (each statement of a VOLATILE
# function takes a fresh snapshot), so no two transactions give out the same free slot. The
# trigger only *tries* the lock (a transaction that changes jobs of two keys never waits on a
# key while holding another: no deadlock, whatever order a batch report or a group cancel
# updates its rows in); when another transaction holds it, this one announces the key
# ('k:<workspace>:<key>' on jobqueue_wake) and the wake-up hub of every listening process
# runs jobqueue_concurrency_settle(workspace, key) after this transaction committed: it
# takes the lock (tries, and again a moment later) and gives the slots out then. The
# maintenance loop settles every key with held jobs too (lifecycle/maintenance), for a key
# whose announcement nobody heard. SQLite serializes its writers: its triggers give the
# slots out at once.

from django.db import migrations, models

PG_FUNCTIONS = r"""
CREATE OR REPLACE FUNCTION jobqueue_concurrency_mark() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    -- BEFORE INSERT of a job with a concurrency key: a job created queued is held back until
    -- a slot is given to it (the AFTER trigger, at once when one is free and a claim could
    -- take it now). An UPDATE is marked by the AFTER trigger instead: a BEFORE UPDATE row
    -- trigger, even one whose WHEN is false, locks every row an UPDATE of its columns
    -- writes, and so would cost every plain job's report a row-lock record.
    IF NEW.status = 'queued' THEN
        NEW.concurrency_held := true;
    ELSE
        NEW.concurrency_held := NULL;
    END IF;
    RETURN NEW;
END
$fn$;

CREATE OR REPLACE FUNCTION jobqueue_concurrency_announce(ws uuid, ckey text, delay double precision)
RETURNS void LANGUAGE sql VOLATILE AS $fn$
-- 'k:<workspace>:<key>' on jobqueue_wake (the key with the percent sign and the space
-- escaped, as in a URL: a payload's space separates its delay), `delay` seconds from now when > 0: the wake-up hubs
-- settle the key then (jobqueue.wakeups, Hub.settle).
SELECT pg_notify('jobqueue_wake', 'k:' || ws::text || ':'
    || replace(replace(ckey, chr(37), chr(37) || '25'), ' ', chr(37) || '20')
    || CASE WHEN delay > 0 THEN ' ' || round(delay::numeric, 3)::text ELSE '' END)
$fn$;

CREATE OR REPLACE FUNCTION jobqueue_concurrency_admit(ws uuid, ckey text) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $fn$
-- Give the key's free slots to its held-back jobs that a claim could take now (due, not
-- past expires_at, not the job of a paused agent), in claim order: one while the key's slot
-- holders (in progress, or queued and given one) are fewer than the job's own limit; the
-- first that does not fit stops it. The caller holds the key's lock. Each job given a slot
-- is announced to its waiters. When a slot stays free and a held-back job that fits it is
-- not due yet, the key is announced for when it is. Answers how many were given one.
DECLARE
    holders integer;
    given integer := 0;
    fits integer;
    due timestamptz;
    h record;
BEGIN
    -- A paused agent's own queued jobs give their slots back (a pause that committed after
    -- an earlier admit read the agent; rows a claim in flight holds are passed over).
    UPDATE job SET concurrency_held = true WHERE id IN (
        SELECT id FROM job
        WHERE workspace_id = ws AND concurrency_key = ckey AND status = 'queued'
          AND concurrency_held IS NULL AND label_set_id IS NULL
          AND job_agent_id IN (SELECT a.id FROM job_agent a WHERE a.paused_at IS NOT NULL)
        FOR NO KEY UPDATE SKIP LOCKED);
    SELECT count(*) INTO holders FROM job
    WHERE workspace_id = ws AND concurrency_key = ckey AND concurrency_held IS NULL
      AND status IN ('queued', 'in_progress');
    LOOP
        -- The next one a claim could take, read without a lock: does it fit?
        SELECT coalesce(concurrency_limit, 1) INTO fits FROM job
        WHERE workspace_id = ws AND concurrency_key = ckey AND status = 'queued'
          AND concurrency_held AND available_at <= STATEMENT_TIMESTAMP()
          AND (expires_at IS NULL OR expires_at > STATEMENT_TIMESTAMP())
          AND (label_set_id IS NOT NULL OR NOT EXISTS (
              SELECT 1 FROM job_agent a WHERE a.id = job.job_agent_id
                AND a.paused_at IS NOT NULL))
        ORDER BY priority DESC, available_at, created_at
        LIMIT 1;
        IF NOT FOUND THEN
            -- None now: the first to become due that a slot is free for, if any.
            SELECT min(available_at) INTO due FROM job
            WHERE workspace_id = ws AND concurrency_key = ckey AND status = 'queued'
              AND concurrency_held AND available_at > STATEMENT_TIMESTAMP()
              AND coalesce(concurrency_limit, 1) > holders;
            IF due IS NOT NULL THEN
                PERFORM jobqueue_concurrency_announce(
                    ws, ckey, greatest(0.001, extract(epoch FROM due - STATEMENT_TIMESTAMP())));
            END IF;
            EXIT;
        END IF;
        EXIT WHEN holders >= fits;
        SELECT id, concurrency_limit, job_agent_id, label_set_id INTO h FROM job
        WHERE workspace_id = ws AND concurrency_key = ckey AND status = 'queued'
          AND concurrency_held AND available_at <= STATEMENT_TIMESTAMP()
          AND (expires_at IS NULL OR expires_at > STATEMENT_TIMESTAMP())
          AND (label_set_id IS NOT NULL OR NOT EXISTS (
              SELECT 1 FROM job_agent a WHERE a.id = job.job_agent_id
                AND a.paused_at IS NOT NULL))
        ORDER BY priority DESC, available_at, created_at
        LIMIT 1
        FOR NO KEY UPDATE SKIP LOCKED;
        -- None unlocked (another transaction holds their rows: the reaper's sweep gives the
        -- slot out), or the one taken (a later one) does not fit its own limit.
        EXIT WHEN NOT FOUND OR holders >= coalesce(h.concurrency_limit, 1);
        UPDATE job SET concurrency_held = NULL WHERE id = h.id;
        PERFORM pg_notify('jobqueue_wake',
            CASE WHEN h.label_set_id IS NULL THEN 'a:' || h.job_agent_id::text
                 ELSE 'l:' || ws::text || ':'
                      || (SELECT s.key FROM job_label_set s WHERE s.id = h.label_set_id) END);
        holders := holders + 1;
        given := given + 1;
    END LOOP;
    RETURN given;
END
$fn$;

CREATE OR REPLACE FUNCTION jobqueue_concurrency_try(ws uuid, ckey text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $fn$
-- Take the key's lock if no one holds it, and then give its free slots out: true. False:
-- another transaction holds it (nothing done; the caller announces the key).
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtextextended(
            'jobqueue.concurrency:' || ws::text || ':' || ckey, 0)) THEN
        RETURN false;
    END IF;
    PERFORM jobqueue_concurrency_admit(ws, ckey);
    RETURN true;
END
$fn$;

CREATE OR REPLACE FUNCTION jobqueue_concurrency_changed() RETURNS trigger
LANGUAGE plpgsql AS $fn$
-- AFTER a job of a key entered or left the queue or its run (or moved its available_at while
-- queued): mark it (held back in the queue, else nothing), then give the key's free slots out, or, when another transaction holds the key's
-- lock, announce the key (the hubs settle it once this transaction committed).
DECLARE
    j job;
BEGIN
    IF TG_OP = 'DELETE' THEN j := OLD; ELSE j := NEW; END IF;
    IF TG_OP = 'UPDATE' THEN
        IF NEW.status = 'queued' THEN
            -- It entered the queue, or its available_at moved: held back until given a slot.
            UPDATE job SET concurrency_held = true WHERE id = NEW.id AND concurrency_held IS NULL;
        ELSIF NEW.concurrency_held THEN
            -- A held-back job left the queue: it holds nothing.
            UPDATE job SET concurrency_held = NULL WHERE id = NEW.id;
        END IF;
    END IF;
    IF NOT jobqueue_concurrency_try(j.workspace_id, j.concurrency_key) THEN
        PERFORM jobqueue_concurrency_announce(j.workspace_id, j.concurrency_key, 0);
    END IF;
    RETURN NULL;
END
$fn$;

CREATE TRIGGER job_concurrency_mark_insert BEFORE INSERT ON job FOR EACH ROW
    WHEN (NEW.concurrency_key IS NOT NULL)
    EXECUTE FUNCTION jobqueue_concurrency_mark();
CREATE TRIGGER job_concurrency_inserted AFTER INSERT ON job FOR EACH ROW
    WHEN (NEW.concurrency_key IS NOT NULL AND NEW.status = 'queued')
    EXECUTE FUNCTION jobqueue_concurrency_changed();
CREATE TRIGGER job_concurrency_moved AFTER UPDATE OF status, available_at ON job FOR EACH ROW
    WHEN (NEW.concurrency_key IS NOT NULL
          AND ((OLD.status IS DISTINCT FROM NEW.status
                AND NOT (OLD.status = 'queued' AND NEW.status = 'in_progress')
                AND (NEW.status = 'queued' OR OLD.status IN ('queued', 'in_progress')))
               OR (NEW.status = 'queued' AND OLD.status = 'queued'
                   AND OLD.available_at IS DISTINCT FROM NEW.available_at)))
    EXECUTE FUNCTION jobqueue_concurrency_changed();
CREATE TRIGGER job_concurrency_deleted AFTER DELETE ON job FOR EACH ROW
    WHEN (OLD.concurrency_key IS NOT NULL AND OLD.concurrency_held IS NULL
          AND OLD.status IN ('queued', 'in_progress'))
    EXECUTE FUNCTION jobqueue_concurrency_changed();
"""

PG_DROP = """
DROP TRIGGER IF EXISTS job_concurrency_mark_insert ON job;
DROP TRIGGER IF EXISTS job_concurrency_inserted ON job;
DROP TRIGGER IF EXISTS job_concurrency_moved ON job;
DROP TRIGGER IF EXISTS job_concurrency_deleted ON job;
DROP FUNCTION IF EXISTS jobqueue_concurrency_changed();
DROP FUNCTION IF EXISTS jobqueue_concurrency_try(uuid, text);
DROP FUNCTION IF EXISTS jobqueue_concurrency_admit(uuid, text);
DROP FUNCTION IF EXISTS jobqueue_concurrency_announce(uuid, text, double precision);
DROP FUNCTION IF EXISTS jobqueue_concurrency_mark();
"""


# SQLite's clock, as jobqueue/sql/sqlite.sql writes it (a literal % doubled).
SQLITE_NOW = "STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')"


def sqlite_admit(workspace: str, key: str) -> str:
    """SQLite's jobqueue_concurrency_admit for a key (SQL expressions: NEW.workspace_id and
    NEW.concurrency_key in a trigger), one statement: of the key's held-back jobs a claim
    could take now (due, not past expires_at, not a paused agent's), in claim order, those
    before the first that does not fit (its rank plus the key's slot holders passes its
    limit) are given a slot. jobqueue/sql/sqlite.sql's concurrency_admit is this statement
    for parameters (tests/integration/core/test_concurrency_keys.py holds them equal)."""
    where = (f"workspace_id = {workspace} AND concurrency_key = {key} AND status = 'queued' "
             f"AND concurrency_held AND available_at <= {SQLITE_NOW} "
             f"AND (expires_at IS NULL OR expires_at > {SQLITE_NOW}) "
             f"AND (label_set_id IS NOT NULL OR job_agent_id NOT IN "
             f"(SELECT id FROM job_agent WHERE paused_at IS NOT NULL))")
    ranked = (f"SELECT id, coalesce(concurrency_limit, 1) AS lim, ROW_NUMBER() OVER "
              f"(ORDER BY priority DESC, available_at, created_at) AS rn FROM job "
              f"WHERE {where}")
    holders = (f"(SELECT count(*) FROM job WHERE workspace_id = {workspace} "
               f"AND concurrency_key = {key} AND concurrency_held IS NULL "
               f"AND status IN ('queued', 'in_progress'))")
    return (f"UPDATE job SET concurrency_held = NULL WHERE id IN ("
            f"SELECT r.id FROM ({ranked}) r WHERE r.rn < (SELECT coalesce(min(f.rn), "
            f"1000000000) FROM ({ranked}) f WHERE {holders} + f.rn > f.lim))")


def _sqlite_admit(row: str) -> str:
    return sqlite_admit(f"{row}.workspace_id", f"{row}.concurrency_key") + ";"


SQLITE_TRIGGERS = [
    "CREATE TRIGGER job_concurrency_inserted AFTER INSERT ON job "
    "WHEN NEW.concurrency_key IS NOT NULL AND NEW.status = 'queued' BEGIN "
    "UPDATE job SET concurrency_held = 1 WHERE id = NEW.id; " + _sqlite_admit("NEW") + " END",
    "CREATE TRIGGER job_concurrency_moved AFTER UPDATE OF status, available_at ON job "
    "WHEN NEW.concurrency_key IS NOT NULL AND ((OLD.status IS NOT NEW.status "
    "AND NOT (OLD.status = 'queued' AND NEW.status = 'in_progress')) "
    "OR (NEW.status = 'queued' AND OLD.status = 'queued' "
    "AND OLD.available_at IS NOT NEW.available_at)) BEGIN "
    "UPDATE job SET concurrency_held = CASE WHEN NEW.status = 'queued' THEN 1 END "
    "WHERE id = NEW.id; " + _sqlite_admit("NEW") + " END",
    "CREATE TRIGGER job_concurrency_deleted AFTER DELETE ON job "
    "WHEN OLD.concurrency_key IS NOT NULL AND OLD.concurrency_held IS NULL "
    "AND OLD.status IN ('queued', 'in_progress') BEGIN " + _sqlite_admit("OLD") + " END",
]
SQLITE_DROP = ["DROP TRIGGER IF EXISTS job_concurrency_inserted",
               "DROP TRIGGER IF EXISTS job_concurrency_moved",
               "DROP TRIGGER IF EXISTS job_concurrency_deleted"]


def add_triggers(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_FUNCTIONS)
    else:
        for statement in SQLITE_TRIGGERS:
            schema_editor.execute(statement)


def drop_triggers(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_DROP)
    else:
        for statement in SQLITE_DROP:
            schema_editor.execute(statement)


class Migration(migrations.Migration):

    dependencies = [
        ("jobqueue", "0026_settle_labelled_dependents"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="concurrency_key",
            field=models.CharField(blank=True, editable=False, max_length=255, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="concurrency_limit",
            field=models.SmallIntegerField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="concurrency_held",
            field=models.BooleanField(blank=True, editable=False, null=True),
        ),
        migrations.RunPython(add_triggers, drop_triggers),
    ]
