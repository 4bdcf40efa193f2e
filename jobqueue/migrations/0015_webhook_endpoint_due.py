# The webhook sender's fair share (maintenance/webhooks.py, fair_share): each endpoint's oldest
# due deliveries. On PostgreSQL the index is built CONCURRENTLY: webhook_delivery takes an
# insert with every report that ends a job of a workspace with endpoints, and a plain CREATE
# INDEX would hold those reports for the whole build.

from django.db import migrations, models

INDEX = models.Index(condition=models.Q(("status", "pending")),
                     fields=["endpoint", "next_attempt_at"], name="webhook_endpoint_due_idx")


def add_index(apps, schema_editor):
    model = apps.get_model("jobqueue", "WebhookDelivery")
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            'CREATE INDEX CONCURRENTLY IF NOT EXISTS "webhook_endpoint_due_idx" '
            'ON "webhook_delivery" ("endpoint_id", "next_attempt_at") '
            "WHERE \"status\" = 'pending'")
    else:
        schema_editor.add_index(model, INDEX)


def remove_index(apps, schema_editor):
    model = apps.get_model("jobqueue", "WebhookDelivery")
    schema_editor.remove_index(model, INDEX)


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY runs outside a transaction

    dependencies = [
        ("jobqueue", "0014_job_effect"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddIndex(model_name="webhookdelivery", index=INDEX)],
            database_operations=[migrations.RunPython(add_index, remove_index)],
        ),
    ]
