# jobqueue_settle_dependents (migration 0021) wakes the waiters of a released child by its
# route: its agent's ('a:<agent>'), or for a labelled child its label set's
# ('l:<workspace>:<labels joined by ",">', jobqueue.wakeups.label_key: the set's `key`), so
# that the matching agents' long-polls take it at once. The function is 0021's with that
# one part changed (the released rows also return their workspace and label set).

from importlib import import_module

from django.db import migrations

PREVIOUS = import_module("jobqueue.migrations.0021_job_dependencies").CREATE

RELEASED = """            RETURNING job.id, job.job_agent_id, job.attempt
"""
WOKEN = """            SELECT pg_notify('jobqueue_wake', 'a:' || a.job_agent_id::text)
            FROM (SELECT DISTINCT job_agent_id FROM released) a
"""
assert PREVIOUS.count(RELEASED) == 1 and PREVIOUS.count(WOKEN) == 1

CREATE = PREVIOUS.replace(RELEASED, """            RETURNING job.id, job.job_agent_id, job.attempt, job.workspace_id,
                job.label_set_id
""").replace(WOKEN, """            SELECT pg_notify('jobqueue_wake', w.route)
            FROM (SELECT DISTINCT CASE WHEN r.label_set_id IS NULL
                                       THEN 'a:' || r.job_agent_id::text
                                       ELSE 'l:' || r.workspace_id::text || ':' || s.key END
                      AS route
                  FROM released r LEFT JOIN job_label_set s ON s.id = r.label_set_id) w
""")


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def restore(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PREVIOUS)


class Migration(migrations.Migration):

    dependencies = [
        ("jobqueue", "0025_job_label_claim_order_idx"),
    ]

    operations = [
        migrations.RunPython(create, restore),
    ]
