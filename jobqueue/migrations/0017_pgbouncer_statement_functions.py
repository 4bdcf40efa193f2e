# PostgreSQL: the hot statements' PL/pgSQL wrappers (jobqueue/lifecycle/pg/functions.py), which
# a connection without prepared statements (JOBQUEUE_PREPARED_STATEMENTS=0, behind PgBouncer
# in transaction mode) calls instead of sending each statement to be planned again. Generated
# from the statements' text in jobqueue/sql/postgresql.sql as this release has it; a later
# release's texts are installed by the post_migrate receiver (jobqueue/apps.py), which runs
# after every `migrate`, without a migration of their own. The reverse drops every wrapper.
# SQLite needs nothing.

from django.db import migrations


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        from jobqueue.lifecycle.pg import functions

        functions.install(schema_editor.connection)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        from jobqueue.lifecycle.pg import functions

        functions.drop_all(schema_editor.connection)


class Migration(migrations.Migration):
    dependencies = [
        ("jobqueue", "0016_job_document_function"),
    ]

    operations = [migrations.RunPython(create, drop)]
