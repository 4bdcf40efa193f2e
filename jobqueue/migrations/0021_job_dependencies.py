# Dependencies between jobs (POST jobs depends_on, POST flows; docs/api.md "Dependencies and
# flows"): the job_dependency edges, and two booleans on job, false for a plain job (a NOT
# NULL column with a constant default: adding it rewrites nothing on PostgreSQL 11+).
#
# PostgreSQL: jobqueue_settle_dependents(parent, status), what a job that ends does to the
# jobs that depend on it, called in the transaction that ended it, only for a job with
# has_dependents (the report statements of jobqueue/sql/postgresql.sql call it in their own
# statement; every other path through lifecycle/dependencies.py). `successful`: each pending
# child whose other parents are all successful becomes queued (a `dispatched` event, its
# agent's waiters woken). `failure`, `cancelled`, `expired`: each pending child ends
# cancelled (message "dependency_failed: <parent id>", a `cancelled` event, its webhook
# outbox rows, its producer's waiters woken), and so on down the graph. Anything else (a
# retryable failure queued again): nothing.
#
# Race-safe under READ COMMITTED: the children are locked (in id order) before they are
# read, and each statement of a VOLATILE function takes a fresh snapshot, so of two parents
# ending at once the second to lock a child sees the first committed (the first does not
# count the second, which it cannot see yet: exactly one of them releases it). The parent is
# passed in, not read: its own statement's update may not be visible. SQLite needs nothing:
# its transitions run through lifecycle/dependencies.py's ORM path (writers are serialized).

import django.db.models.deletion
from django.db import migrations, models

CREATE = """
CREATE OR REPLACE FUNCTION jobqueue_settle_dependents(parent uuid, parent_status text)
RETURNS integer LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    frontier uuid[];
    settled integer := 0;
    n integer;
BEGIN
    IF parent_status = 'successful' THEN
        PERFORM 1 FROM job
        WHERE job.id IN (SELECT d.child_id FROM job_dependency d WHERE d.parent_id = parent)
          AND job.status = 'pending'
        ORDER BY job.id FOR NO KEY UPDATE;
        WITH released AS (
            UPDATE job SET status = 'queued',
                available_at = GREATEST(job.available_at, STATEMENT_TIMESTAMP()),
                updated_at = STATEMENT_TIMESTAMP()
            WHERE job.id IN (SELECT d.child_id FROM job_dependency d WHERE d.parent_id = parent)
              AND job.status = 'pending'
              AND NOT EXISTS (
                  SELECT 1 FROM job_dependency o JOIN job p ON p.id = o.parent_id
                  WHERE o.child_id = job.id AND o.parent_id <> parent
                    AND p.status <> 'successful')
            RETURNING job.id, job.job_agent_id, job.attempt
        ), events AS (
            INSERT INTO job_event (job_id, kind, attempt, actor, detail, created_at)
            SELECT id, 'dispatched', attempt, '',
                   jsonb_build_object('dependencies', 'successful', 'parent', parent),
                   STATEMENT_TIMESTAMP()
            FROM released
        ), woken AS (
            SELECT pg_notify('jobqueue_wake', 'a:' || a.job_agent_id::text)
            FROM (SELECT DISTINCT job_agent_id FROM released) a
        )
        SELECT count(*) INTO settled
        FROM released CROSS JOIN (SELECT count(*) FROM woken) w;
        RETURN settled;
    END IF;
    IF parent_status NOT IN ('failure', 'cancelled', 'expired') THEN
        RETURN 0;
    END IF;
    frontier := ARRAY[parent];
    LOOP
        PERFORM 1 FROM job
        WHERE job.id IN (SELECT d.child_id FROM job_dependency d
                         WHERE d.parent_id = ANY(frontier))
          AND job.status = 'pending'
        ORDER BY job.id FOR NO KEY UPDATE;
        WITH src AS (
            SELECT DISTINCT ON (d.child_id) d.child_id, d.parent_id FROM job_dependency d
            WHERE d.parent_id = ANY(frontier) ORDER BY d.child_id, d.parent_id
        ), cancelled AS (
            UPDATE job SET status = 'cancelled', completed_at = STATEMENT_TIMESTAMP(),
                message = 'dependency_failed: ' || src.parent_id::text,
                updated_at = STATEMENT_TIMESTAMP()
            FROM src WHERE job.id = src.child_id AND job.status = 'pending'
            RETURNING job.id, job.workspace_id, job.job_agent_id, job.status,
                job.job_agent_config, job.result, job.message, job.external_id, job.attempt,
                job.max_attempts, job.priority, job.idempotency_key, job.available_at,
                job.created_at, job.started_at, job.completed_at, job.updated_at, job.watched,
                src.parent_id AS failed_parent
        ), events AS (
            INSERT INTO job_event (job_id, kind, attempt, actor, detail, created_at)
            SELECT id, 'cancelled', attempt, '',
                   jsonb_build_object('reason', 'dependency_failed', 'parent', failed_parent),
                   STATEMENT_TIMESTAMP()
            FROM cancelled
        ), hook AS (
            INSERT INTO webhook_delivery (id, endpoint_id, job_id, payload)
            SELECT gen_random_uuid(), e.id, c.id, jobqueue_finished_payload(to_jsonb(c))
            FROM cancelled c JOIN webhook_endpoint e ON e.workspace_id = c.workspace_id
            WHERE e.events = '[]'::jsonb OR jsonb_exists(e.events, 'job.finished')
        ), woken AS (
            SELECT pg_notify('jobqueue_wake', 'j:' || c.id::text) FROM cancelled c
            WHERE c.watched
        )
        SELECT array_agg(c.id), count(*) INTO frontier, n
        FROM cancelled c CROSS JOIN (SELECT count(*) FROM woken) w;
        settled := settled + n;
        EXIT WHEN n = 0;
    END LOOP;
    RETURN settled;
END
$fn$;
"""
DROP = "DROP FUNCTION IF EXISTS jobqueue_settle_dependents(uuid, text);"


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):

    dependencies = [
        ("jobqueue", "0020_schedules"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="has_dependents",
            field=models.BooleanField(db_default=False, default=False, editable=False),
        ),
        migrations.AddField(
            model_name="job",
            name="has_parents",
            field=models.BooleanField(db_default=False, default=False, editable=False),
        ),
        migrations.CreateModel(
            name="JobDependency",
            fields=[
                ("pk", models.CompositePrimaryKey("child_id", "parent_id", blank=True,
                                                  editable=False, primary_key=True,
                                                  serialize=False)),
                ("child", models.ForeignKey(db_index=False,
                                            on_delete=django.db.models.deletion.CASCADE,
                                            related_name="parent_edges", to="jobqueue.job")),
                ("parent", models.ForeignKey(db_index=False,
                                             on_delete=django.db.models.deletion.CASCADE,
                                             related_name="child_edges", to="jobqueue.job")),
            ],
            options={
                "db_table": "job_dependency",
                "verbose_name_plural": "job dependencies",
                "indexes": [models.Index(fields=["parent"], name="job_dependency_parent_idx")],
            },
        ),
        migrations.RunPython(create, drop),
    ]
