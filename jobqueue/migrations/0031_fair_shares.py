# Fair shares (#29; docs/api.md "Fair shares"): fairness_key rows (PUT fairness-keys/{key},
# a key's weight), job.fairness_key and job.fair_at (NULL for a plain job: no bytes in its
# row, no rewrite of the table). A fair job's fair_at is its place in claim order, given when
# it is created (jobqueue/lifecycle/fairness.py); 0032 rebuilds the claim indexes on
# COALESCE(fair_at, available_at).
#
# A fair job that cannot be claimed yet must not sort ahead of those that can (the claim
# would read past it: its index orders by the place, and `available_at <= now` only filters),
# nor keep a place it took long before it could run. So its place is moved, by triggers that
# fire for fair jobs only (a plain job's writes pay nothing: their WHEN is false, and an AFTER
# trigger locks nothing): created with a delay, its place is no earlier than its
# available_at; when its available_at moves later while queued (a retry's backoff, a
# release's retry_after, a debounce), likewise; released into the queue (from hold, by its
# dependencies), no earlier than its release.

import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models

PG_FUNCTIONS = r"""
CREATE OR REPLACE FUNCTION jobqueue_fair_replaced() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
    released timestamptz;
BEGIN
    IF TG_OP = 'UPDATE' THEN
        IF OLD.status = 'pending' THEN
            released := STATEMENT_TIMESTAMP();
        END IF;
    END IF;
    UPDATE job SET fair_at = greatest(NEW.fair_at, NEW.available_at, released)
    WHERE id = NEW.id;
    RETURN NULL;
END
$fn$;

CREATE TRIGGER job_fair_inserted AFTER INSERT ON job FOR EACH ROW
    WHEN (NEW.fairness_key IS NOT NULL AND NEW.available_at > NEW.created_at
          AND NEW.fair_at < NEW.available_at)
    EXECUTE FUNCTION jobqueue_fair_replaced();
CREATE TRIGGER job_fair_moved AFTER UPDATE OF status, available_at ON job FOR EACH ROW
    WHEN (NEW.fairness_key IS NOT NULL AND NEW.status = 'queued'
          AND (OLD.status = 'pending' OR NEW.available_at > OLD.available_at))
    EXECUTE FUNCTION jobqueue_fair_replaced();
"""

PG_DROP = """
DROP TRIGGER IF EXISTS job_fair_inserted ON job;
DROP TRIGGER IF EXISTS job_fair_moved ON job;
DROP FUNCTION IF EXISTS jobqueue_fair_replaced();
"""

SQLITE_NOW = "STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')"
SQLITE_TRIGGERS = [
    "CREATE TRIGGER job_fair_inserted AFTER INSERT ON job "
    "WHEN NEW.fairness_key IS NOT NULL AND NEW.available_at > NEW.created_at "
    "AND NEW.fair_at < NEW.available_at BEGIN "
    "UPDATE job SET fair_at = NEW.available_at WHERE id = NEW.id; END",
    "CREATE TRIGGER job_fair_moved AFTER UPDATE OF status, available_at ON job "
    "WHEN NEW.fairness_key IS NOT NULL AND NEW.status = 'queued' "
    "AND (OLD.status = 'pending' OR NEW.available_at > OLD.available_at) BEGIN "
    "UPDATE job SET fair_at = max(coalesce(NEW.fair_at, NEW.available_at), NEW.available_at, "
    f"CASE WHEN OLD.status = 'pending' THEN {SQLITE_NOW} ELSE NEW.available_at END) "
    "WHERE id = NEW.id; END",
]
SQLITE_DROP = ["DROP TRIGGER IF EXISTS job_fair_inserted",
               "DROP TRIGGER IF EXISTS job_fair_moved"]


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
        ("jobqueue", "0030_job_rate_limit_indexes"),
    ]

    operations = [
        migrations.CreateModel(
            name="FairnessKey",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False,
                                           verbose_name="ID")),
                ("key", models.CharField(max_length=255)),
                ("weight", models.PositiveSmallIntegerField(default=1)),
                ("created_at", models.DateTimeField(
                    db_default=django.db.models.functions.datetime.Now(), editable=False)),
                ("updated_at", models.DateTimeField(
                    db_default=django.db.models.functions.datetime.Now())),
                ("workspace", models.ForeignKey(
                    db_index=False, on_delete=django.db.models.deletion.CASCADE,
                    related_name="+", to="jobqueue.workspace")),
            ],
            options={"db_table": "fairness_key", "ordering": ["key"]},
        ),
        migrations.AddConstraint(
            model_name="fairnesskey",
            constraint=models.UniqueConstraint(fields=("workspace", "key"),
                                               name="fairness_key_unique"),
        ),
        migrations.AddField(
            model_name="job",
            name="fairness_key",
            field=models.CharField(blank=True, editable=False, max_length=255, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="fair_at",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.RunPython(add_triggers, drop_triggers),
    ]
