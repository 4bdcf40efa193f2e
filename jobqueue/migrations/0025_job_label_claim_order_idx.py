# The index that serves claims of labelled jobs (#28; jobqueue/sql/postgresql.sql,
# job_claim_available_routed): one label set's queued jobs in claim order. Partial: a job that
# targets one agent never enters it, nor do its updates. On PostgreSQL built CONCURRENTLY
# (`job` takes every claim and report; a plain CREATE INDEX would hold their writes for the
# whole scan of the table), in a migration of its own: one built CONCURRENTLY that fails
# leaves an INVALID index behind, so it is dropped first and built again when `migrate` runs
# again. Then label_set_id's foreign key, added NOT VALID by 0024, is validated.

from django.db import migrations, models

INDEX = models.Index(
    models.F("label_set"), models.OrderBy(models.F("priority"), descending=True),
    models.F("available_at"), models.F("created_at"),
    condition=models.Q(("label_set__isnull", False), ("status", "queued")),
    name="job_label_claim_order_idx")


def add_index(apps, schema_editor):
    model = apps.get_model("jobqueue", "Job")
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute('DROP INDEX CONCURRENTLY IF EXISTS "job_label_claim_order_idx"')
        schema_editor.execute(
            'CREATE INDEX CONCURRENTLY "job_label_claim_order_idx" ON "job" '
            '("label_set_id", "priority" DESC, "available_at", "created_at") '
            "WHERE (\"label_set_id\" IS NOT NULL AND \"status\" = 'queued')")
        # 0024 added label_set_id's foreign key NOT VALID: validate it now (a scan that holds
        # no claim or report: SHARE UPDATE EXCLUSIVE).
        schema_editor.execute('ALTER TABLE "job" VALIDATE CONSTRAINT '
                              '"job_label_set_id_77401272_fk_job_label_set_id"')
    else:
        schema_editor.add_index(model, INDEX)


def remove_index(apps, schema_editor):
    model = apps.get_model("jobqueue", "Job")
    schema_editor.remove_index(model, INDEX)


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY runs outside a transaction

    dependencies = [
        ("jobqueue", "0024_job_labels"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(add_index, remove_index)],
            state_operations=[migrations.AddIndex(model_name="job", index=INDEX)],
        ),
    ]
