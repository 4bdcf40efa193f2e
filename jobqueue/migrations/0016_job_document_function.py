# PostgreSQL: jobqueue_finished_payload(job jsonb), a job.finished delivery's stored body
# ({"job": ...}) as lifecycle/finished.finished_payload writes it, for the report statements
# (jobqueue/sql/postgresql.sql), which fix the body in their own statement: they pass
# to_jsonb(done), the job as the statement leaves it. Only the listed fields are taken (never dispatch_context);
# times are UTC with six fractional digits and a Z (finished.json_time). SQLite needs nothing:
# its transitions run through the ORM, which calls job_document itself.

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION jobqueue_json_time(t timestamptz) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT replace(to_char(t AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US'), ' ', 'T') || 'Z'
$$;
CREATE OR REPLACE FUNCTION jobqueue_finished_payload(job jsonb) RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT jsonb_build_object('job', jsonb_build_object(
        'id', job->'id', 'workspace_id', job->'workspace_id',
        'job_agent_id', job->'job_agent_id', 'status', job->'status',
        'job_agent_config', job->'job_agent_config', 'result', job->'result',
        'message', job->'message', 'external_id', job->'external_id',
        'attempt', job->'attempt', 'max_attempts', job->'max_attempts',
        'priority', job->'priority', 'idempotency_key', job->'idempotency_key')
        || (SELECT jsonb_object_agg(name, jobqueue_json_time((job->>name)::timestamptz))
            FROM unnest(ARRAY['available_at', 'created_at', 'started_at', 'completed_at',
                              'updated_at']) AS name))
$$;
"""
DROP = """
DROP FUNCTION IF EXISTS jobqueue_finished_payload(jsonb);
DROP FUNCTION IF EXISTS jobqueue_json_time(timestamptz);
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [
        ("jobqueue", "0015_webhook_endpoint_due"),
    ]

    operations = [migrations.RunPython(create, drop)]
