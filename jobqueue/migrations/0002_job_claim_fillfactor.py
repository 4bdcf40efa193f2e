from django.db import migrations


def set_fillfactor(apps, schema_editor):
    # Heartbeats rewrite one narrow job_claim row again and again. Free space on each page
    # lets PostgreSQL make those heap-only (HOT) updates, with no index writes.
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE job_claim SET (fillfactor = 50)")


def reset_fillfactor(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE job_claim RESET (fillfactor)")


class Migration(migrations.Migration):
    dependencies = [("jobqueue", "0001_initial")]
    operations = [migrations.RunPython(set_fillfactor, reset_fillfactor)]
