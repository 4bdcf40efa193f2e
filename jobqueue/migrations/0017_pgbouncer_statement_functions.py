# PostgreSQL: the hot statements' PL/pgSQL wrappers (jobqueue/lifecycle/pg/functions.py), which
# a connection without prepared statements (JOBQUEUE_PREPARED_STATEMENTS=0, behind PgBouncer
# in transaction mode) calls instead of sending each statement to be planned again. They are
# generated from the statements' text in jobqueue/sql/postgresql.sql as the running code has
# it, so they are installed by the post_migrate receiver (jobqueue/apps.py), which runs after
# every `migrate`, once every table has its current columns: installed here, on the way
# forward, a text naming a column a later migration adds (job.unique_key, 0018) failed and
# logged a warning on every fresh database. The reverse drops every wrapper. SQLite needs
# nothing.

from django.db import migrations


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        from jobqueue.lifecycle.pg import functions

        functions.drop_all(schema_editor.connection)


class Migration(migrations.Migration):
    dependencies = [
        ("jobqueue", "0016_job_document_function"),
    ]

    operations = [migrations.RunPython(migrations.RunPython.noop, drop)]
