# SQLite: a job with a concurrency key and a rate limit key that enters the queue by an
# UPDATE (dispatched, released by its dependencies, retried, reaped, released, requeued) is
# given its slot's verdict before the rate limit's admission reads it, as on PostgreSQL
# (0033's jobqueue_flow_changed: concurrency, fair, rate) and as 0029 already ordered the
# INSERT triggers.
#
# SQLite fires a row's triggers newest first. 0027's job_concurrency_moved is older than
# 0029's job_rate_moved, so the rate trigger ran first: the job, its concurrency_held not set
# yet, took a free permit, and only then was held back for its slot. It kept a permit it could
# not use while its key's other jobs waited for one, until the reaper's sweep took the permit
# back (sqlite.sql rate_hold_paused), or for good without maintenance. Made again here, the
# concurrency trigger is the newest and fires first. PostgreSQL is unchanged (one trigger
# per event since 0033).

import importlib

from django.db import migrations

NAME = "job_concurrency_moved"


def _trigger():
    """0027's SQLite job_concurrency_moved, as written there."""
    m = importlib.import_module("jobqueue.migrations.0027_job_concurrency_keys")
    return next(t for t in m.SQLITE_TRIGGERS if f"{NAME} " in t)


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {NAME}")
        schema_editor.execute(_trigger())


class Migration(migrations.Migration):

    dependencies = [
        ("jobqueue", "0033_job_flow_triggers"),
    ]

    operations = [
        # Backwards: the trigger stays as made here (the same trigger; only its firing
        # order among the row's triggers changed).
        migrations.RunPython(forwards, migrations.RunPython.noop),
    ]
