# Unique jobs (POST jobs unique_key, and the event kind `replaced`; docs/api.md "Unique jobs and debounce"). The column is
# nullable, so adding it rewrites nothing. The index is partial (a job without a key never
# enters it) and, on PostgreSQL, built CONCURRENTLY: `job` takes every claim and report, and a
# plain CREATE INDEX would hold them for the whole scan of the table.

from django.db import migrations, models

INDEX = models.Index(condition=models.Q(("unique_key__isnull", False)),
                     fields=["workspace", "unique_key"], name="job_unique_key_idx")


def add_index(apps, schema_editor):
    model = apps.get_model("jobqueue", "Job")
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            'CREATE INDEX CONCURRENTLY IF NOT EXISTS "job_unique_key_idx" '
            'ON "job" ("workspace_id", "unique_key") WHERE "unique_key" IS NOT NULL')
    else:
        schema_editor.add_index(model, INDEX)


def remove_index(apps, schema_editor):
    model = apps.get_model("jobqueue", "Job")
    schema_editor.remove_index(model, INDEX)


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY runs outside a transaction

    dependencies = [
        ("jobqueue", "0017_pgbouncer_statement_functions"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="unique_key",
            field=models.CharField(blank=True, max_length=255, null=True),
        ),
        migrations.AlterField(  # the event kind `replaced` (choices only: no SQL)
            model_name="jobevent",
            name="kind",
            field=models.CharField(choices=[
                ("created", "created"), ("dispatched", "dispatched"), ("claimed", "claimed"),
                ("released", "released"), ("reaped", "reaped (requeued)"),
                ("expired", "expired"), ("progress_reported", "progress reported"),
                ("status_reported", "status reported"), ("cancelled", "cancelled"),
                ("requeued", "requeued"), ("stale_write_refused", "stale write refused"),
                ("timed_out", "timed out"), ("deadline_passed", "deadline passed"),
                ("replaced", "replaced")], max_length=32),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddIndex(model_name="job", index=INDEX)],
            database_operations=[migrations.RunPython(add_index, remove_index)],
        ),
    ]
