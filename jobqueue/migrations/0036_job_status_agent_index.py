# #26 item 4: an index entry fewer on each version of a job's row. The producers' list of one
# status and an agent's list of its jobs are served by one index, job_workspace_status_idx
# extended with job_agent_id as its third column, and the plain index on job_agent_id (the
# foreign key's) goes: a job's claim and its report each wrote an entry in both. The agent
# readers name the agent's workspace and statuses (lifecycle/records.py, agent_jobs). What
# has no index of its own now: an agent's deletion, whose PROTECT and foreign key checks
# read all of job_workspace_status_idx (rare; docs/performance.md, "What reaching the WAL
# target takes").
# On PostgreSQL the new index is built CONCURRENTLY beside the old one and swapped in under
# its name (indexes.swap), and the old FK index dropped CONCURRENTLY. On SQLite the new
# index is built plainly (its writers are serialized) and the FK index stays: SQLite writes
# no WAL that the drop would save, and its planner reads that index where PostgreSQL's
# reads job_workspace_status_idx whole (an agent's health, the admin's agent filter, a
# pause). By name, not an AlterField: that would rebuild the table and drop its triggers.

from django.db import migrations, models

from jobqueue import indexes as _indexes

STATUS = models.Index(fields=["workspace", "status", "job_agent"],
                      name="job_workspace_status_idx")
OLD_STATUS = models.Index(fields=["workspace", "status"], name="job_workspace_status_idx")
AGENT = models.Index(fields=["job_agent"], name="job_job_agent_id_4652756e")


def forwards(apps, schema_editor):
    _indexes.rebuild(apps, schema_editor, [(STATUS, OLD_STATUS)], [])
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{AGENT.name}"')


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        _indexes.concurrently(apps.get_model("jobqueue", "Job"), schema_editor, AGENT)
    _indexes.unbuild(apps, schema_editor, [(STATUS, OLD_STATUS)], [])


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY runs outside a transaction

    dependencies = [
        ("jobqueue", "0035_artifact_file_deletion"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(forwards, backwards)],
            state_operations=[
                migrations.AlterField(
                    model_name="job", name="job_agent",
                    field=models.ForeignKey(blank=True, db_index=False, null=True,
                                            on_delete=models.deletion.PROTECT,
                                            related_name="jobs", to="jobqueue.jobagent"),
                ),
                migrations.RemoveIndex(model_name="job", name="job_workspace_status_idx"),
                migrations.AddIndex(model_name="job", index=STATUS),
            ],
        ),
    ]
