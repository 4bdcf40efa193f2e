from django.db import migrations, models

# job_event is append-only, so its rows lie in created_at order: a BRIN index (a few pages,
# next to nothing per insert) lets the admin's charts read one time window of events
# (jobqueue/admin/charts.py). PostgreSQL only; SQLite reads the window by scanning.
BRIN = "CREATE INDEX IF NOT EXISTS job_event_created_brin ON job_event USING brin (created_at)"


def create_brin(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(BRIN)


def drop_brin(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP INDEX IF EXISTS job_event_created_brin")


class Migration(migrations.Migration):
    dependencies = [("jobqueue", "0008_job_outputs")]

    operations = [
        migrations.AddField(
            model_name="jobagent",
            name="paused_at",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="jobagent",
            name="paused_by",
            field=models.CharField(blank=True, default="", editable=False, max_length=255),
        ),
        migrations.AddField(
            model_name="jobagent",
            name="paused_reason",
            field=models.CharField(blank=True, default="", editable=False, max_length=500),
        ),
        migrations.RunPython(create_brin, drop_brin, elidable=False),
    ]
