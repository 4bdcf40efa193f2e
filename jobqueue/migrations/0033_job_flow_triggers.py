# One row trigger per event for flow control on PostgreSQL (#29 item 5: a plain job's core
# cycle unchanged), five in place of the eleven that 0027, 0029 and 0031 created.
#
# A row trigger whose WHEN is false still costs each statement that writes the table: its
# WHEN is read from the catalog's node text and compiled once per statement, then evaluated
# per row. Eleven of them, four on every claim's and report's UPDATE with long conditions,
# cost a plain job's claim and report about 60 us each (10 % of the core cycle at one agent;
# docs/performance.md). Here each event has one trigger whose WHEN only asks whether the row
# carries a flow-control key at all, and one function, jobqueue_flow_changed, does what the
# old triggers did, in their order (theirs was by name: concurrency, fair, rate) and on the
# same conditions, now tested in PL/pgSQL, for keyed jobs only:
#
#   job_flow_mark      BEFORE INSERT       held flags of a job created queued (0027, 0029)
#   job_flow_inserted  AFTER INSERT        slot, place, permit (0027, 0031, 0029)
#   job_flow_moved     AFTER UPDATE OF status, available_at
#                                          entered or left the queue or its run, moved its
#                                          available_at (0027, 0031, 0029)
#   job_flow_slotted   AFTER UPDATE OF concurrency_held, rate limited jobs only
#                                          given its slot: its permit may come (0029)
#   job_flow_deleted   AFTER DELETE        a slot or a permit freed (0027, 0029)
#
# A trigger whose columns a statement does not set costs it a bitmap test, not its WHEN: a
# claim or a report sets status, not concurrency_held, and the admission sets
# concurrency_held, so `slotted` stays a trigger of its own whose WHEN skips the jobs that
# have no rate limit key. The helpers the triggers called
# (jobqueue_concurrency_try/announce, jobqueue_rate_try/announce) are unchanged. SQLite keeps
# its triggers: it compiles them into each prepared statement once, not per execution.

from django.db import migrations

PG_FUNCTIONS = r"""
CREATE OR REPLACE FUNCTION jobqueue_flow_mark() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    -- BEFORE INSERT of a job with a concurrency or rate limit key: a job created queued is
    -- held back until a slot (a permit) is given to it, by the AFTER trigger. An UPDATE is
    -- marked by the AFTER trigger instead: a BEFORE UPDATE row trigger, even one whose WHEN
    -- is false, locks every row an UPDATE of its columns writes, and so would cost every
    -- plain job's report a row-lock record.
    IF NEW.concurrency_key IS NOT NULL THEN
        NEW.concurrency_held := CASE WHEN NEW.status = 'queued' THEN true END;
    END IF;
    IF NEW.rate_limit_key IS NOT NULL THEN
        NEW.rate_held := CASE WHEN NEW.status = 'queued' THEN true END;
    END IF;
    RETURN NEW;
END
$fn$;

CREATE OR REPLACE FUNCTION jobqueue_flow_changed() RETURNS trigger
LANGUAGE plpgsql AS $fn$
-- AFTER a keyed job was inserted, updated (status or available_at: 'moved';
-- concurrency_held: 'slotted') or deleted. For a concurrency key (a rate limit key): when
-- the job entered or left the queue or its run, or moved its available_at while queued,
-- mark it (held back in the queue, else nothing), then give the key's free slots (permits)
-- out, or, when another transaction holds the key's lock, announce the key (the hubs settle
-- it once this transaction committed). A rate limited job is also settled when it was given
-- its concurrency slot: its permit comes only then. For a fairness key: a job that cannot be claimed yet is placed no earlier than
-- when it can (its available_at; a release from pending: now), so a claim never reads past it.
DECLARE
    j job;
    conc boolean := false;
    fair boolean := false;
    rate boolean := false;
    released timestamptz;
BEGIN
    IF TG_OP = 'INSERT' THEN
        j := NEW;
        conc := NEW.concurrency_key IS NOT NULL AND NEW.status = 'queued';
        fair := NEW.fairness_key IS NOT NULL AND NEW.available_at > NEW.created_at
                AND NEW.fair_at < NEW.available_at;
        rate := NEW.rate_limit_key IS NOT NULL AND NEW.status = 'queued';
    ELSIF TG_OP = 'DELETE' THEN
        j := OLD;
        conc := OLD.concurrency_key IS NOT NULL AND OLD.concurrency_held IS NULL
                AND OLD.status IN ('queued', 'in_progress');
        rate := OLD.rate_limit_key IS NOT NULL AND OLD.rate_held IS NULL
                AND OLD.status = 'queued';
    ELSIF TG_ARGV[0] = 'slotted' THEN
        -- A rate limited job given its concurrency slot: its permit may come now.
        j := NEW;
        -- (NULL as in the old WHEN: no call. `IF NULL AND f()` would still call f.)
        rate := NEW.rate_limit_key IS NOT NULL AND NEW.status = 'queued' AND NEW.rate_held
                AND OLD.concurrency_held AND NEW.concurrency_held IS NULL;
        IF rate THEN
            IF NOT jobqueue_rate_try(j.workspace_id, j.rate_limit_key) THEN
                PERFORM jobqueue_rate_announce(j.workspace_id, j.rate_limit_key, 0);
            END IF;
        END IF;
        RETURN NULL;
    ELSE
        j := NEW;
        conc := NEW.concurrency_key IS NOT NULL
                AND ((OLD.status IS DISTINCT FROM NEW.status
                      AND NOT (OLD.status = 'queued' AND NEW.status = 'in_progress')
                      AND (NEW.status = 'queued' OR OLD.status IN ('queued', 'in_progress')))
                     OR (NEW.status = 'queued' AND OLD.status = 'queued'
                         AND OLD.available_at IS DISTINCT FROM NEW.available_at));
        fair := NEW.fairness_key IS NOT NULL AND NEW.status = 'queued'
                AND (OLD.status = 'pending' OR NEW.available_at > OLD.available_at);
        rate := NEW.rate_limit_key IS NOT NULL
                AND ((OLD.status IS DISTINCT FROM NEW.status
                      AND NOT (OLD.status = 'queued' AND NEW.status = 'in_progress')
                      AND (NEW.status = 'queued' OR OLD.status = 'queued'))
                     OR (NEW.status = 'queued' AND OLD.status = 'queued'
                         AND OLD.available_at IS DISTINCT FROM NEW.available_at));
    END IF;
    IF conc THEN
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
    END IF;
    IF fair THEN
        IF TG_OP = 'UPDATE' AND OLD.status = 'pending' THEN
            released := STATEMENT_TIMESTAMP();
        END IF;
        UPDATE job SET fair_at = greatest(NEW.fair_at, NEW.available_at, released)
        WHERE id = NEW.id;
    END IF;
    IF rate AND TG_OP = 'UPDATE' THEN
        IF NEW.status = 'queued' THEN
            UPDATE job SET rate_held = true WHERE id = NEW.id AND rate_held IS NULL;
        ELSIF NEW.rate_held THEN
            UPDATE job SET rate_held = NULL WHERE id = NEW.id;
        END IF;
    END IF;
    IF rate THEN
        IF NOT jobqueue_rate_try(j.workspace_id, j.rate_limit_key) THEN
            PERFORM jobqueue_rate_announce(j.workspace_id, j.rate_limit_key, 0);
        END IF;
    END IF;
    RETURN NULL;
END
$fn$;

DROP TRIGGER IF EXISTS job_concurrency_mark_insert ON job;
DROP TRIGGER IF EXISTS job_concurrency_inserted ON job;
DROP TRIGGER IF EXISTS job_concurrency_moved ON job;
DROP TRIGGER IF EXISTS job_concurrency_deleted ON job;
DROP TRIGGER IF EXISTS job_rate_mark_insert ON job;
DROP TRIGGER IF EXISTS job_rate_inserted ON job;
DROP TRIGGER IF EXISTS job_rate_moved ON job;
DROP TRIGGER IF EXISTS job_rate_slotted ON job;
DROP TRIGGER IF EXISTS job_rate_deleted ON job;
DROP TRIGGER IF EXISTS job_fair_inserted ON job;
DROP TRIGGER IF EXISTS job_fair_moved ON job;
DROP FUNCTION IF EXISTS jobqueue_concurrency_changed();
DROP FUNCTION IF EXISTS jobqueue_concurrency_mark();
DROP FUNCTION IF EXISTS jobqueue_rate_changed();
DROP FUNCTION IF EXISTS jobqueue_rate_mark();
DROP FUNCTION IF EXISTS jobqueue_fair_replaced();

CREATE TRIGGER job_flow_mark BEFORE INSERT ON job FOR EACH ROW
    WHEN (NEW.concurrency_key IS NOT NULL OR NEW.rate_limit_key IS NOT NULL)
    EXECUTE FUNCTION jobqueue_flow_mark();
CREATE TRIGGER job_flow_inserted AFTER INSERT ON job FOR EACH ROW
    WHEN (NEW.concurrency_key IS NOT NULL OR NEW.rate_limit_key IS NOT NULL
          OR NEW.fairness_key IS NOT NULL)
    EXECUTE FUNCTION jobqueue_flow_changed();
CREATE TRIGGER job_flow_moved AFTER UPDATE OF status, available_at ON job FOR EACH ROW
    WHEN (NEW.concurrency_key IS NOT NULL OR NEW.rate_limit_key IS NOT NULL
          OR NEW.fairness_key IS NOT NULL)
    EXECUTE FUNCTION jobqueue_flow_changed('moved');
CREATE TRIGGER job_flow_slotted AFTER UPDATE OF concurrency_held ON job FOR EACH ROW
    WHEN (NEW.rate_limit_key IS NOT NULL)
    EXECUTE FUNCTION jobqueue_flow_changed('slotted');
CREATE TRIGGER job_flow_deleted AFTER DELETE ON job FOR EACH ROW
    WHEN (OLD.concurrency_key IS NOT NULL OR OLD.rate_limit_key IS NOT NULL)
    EXECUTE FUNCTION jobqueue_flow_changed();
"""

PG_DROP = """
DROP TRIGGER IF EXISTS job_flow_mark ON job;
DROP TRIGGER IF EXISTS job_flow_inserted ON job;
DROP TRIGGER IF EXISTS job_flow_moved ON job;
DROP TRIGGER IF EXISTS job_flow_slotted ON job;
DROP TRIGGER IF EXISTS job_flow_deleted ON job;
DROP FUNCTION IF EXISTS jobqueue_flow_changed();
DROP FUNCTION IF EXISTS jobqueue_flow_mark();
"""


def _old_triggers(name: str) -> str:
    """The trigger functions and triggers a migration before this one created (its
    PG_FUNCTIONS, whose helpers CREATE OR REPLACE as they were)."""
    import importlib

    return importlib.import_module(f"jobqueue.migrations.{name}").PG_FUNCTIONS


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_FUNCTIONS)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_DROP)
        for name in ("0027_job_concurrency_keys", "0029_rate_limits", "0031_fair_shares"):
            schema_editor.execute(_old_triggers(name))


class Migration(migrations.Migration):

    dependencies = [
        ("jobqueue", "0032_job_fair_claim_order"),
    ]

    operations = [
        migrations.RunPython(forwards, backwards),
    ]
