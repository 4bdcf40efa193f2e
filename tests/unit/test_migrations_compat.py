"""Upgrades migrate while the previous release still serves (docs/deploying.md, "Upgrades"), so
a migration must not break the code before it. What a test can hold it to: a column added to
an existing table is nullable or has a database default (`db_default`), since the old code's
INSERTs leave the column out and Django's `default` is applied by Django only; and nothing is
dropped or renamed in the release that stops using it (that waits a release: each such
operation is listed here, with why the code before it did not use the column any more)."""

import importlib
import pkgutil

import pytest
from django.db import migrations

APPS = ["jobqueue", "agents"]
# Columns added, before this rule was written down, with a Django-only default.
BEFORE_THE_RULE = {
    ("jobqueue", "0003_reaperrun_sweeps", "reaperrun", "sweeps"),
    ("jobqueue", "0009_agent_pause_event_time_index", "jobagent", "paused_by"),
    ("jobqueue", "0009_agent_pause_event_time_index", "jobagent", "paused_reason"),
}
# Drops and renames, each one release after the code stopped using what it drops.
DROPPED_A_RELEASE_LATER: set[tuple[str, str, str]] = set()


def all_migrations():
    for app in APPS:
        package = importlib.import_module(f"{app}.migrations")
        for info in pkgutil.iter_modules(package.__path__):
            module = importlib.import_module(f"{app}.migrations.{info.name}")
            yield app, info.name, module.Migration


def models_created(migration) -> set[str]:
    return {op.name.lower() for op in migration.operations
            if isinstance(op, migrations.CreateModel)}


@pytest.mark.parametrize(("app", "name", "migration"), list(all_migrations()),
                         ids=lambda v: v if isinstance(v, str) else "")
def test_a_migration_keeps_the_release_before_it_working(app, name, migration):
    created = models_created(migration)
    for op in migration.operations:
        if isinstance(op, migrations.AddField) and op.model_name.lower() not in created:
            field = op.field
            keeps = (field.null or field.has_db_default() or field.many_to_many
                     or (app, name, op.model_name.lower(), op.name) in BEFORE_THE_RULE)
            assert keeps, (f"{app}/{name}: {op.model_name}.{op.name} is NOT NULL without a "
                           "db_default: the running release's inserts would fail after migrate")
        if isinstance(op, (migrations.RemoveField, migrations.RenameField,
                           migrations.DeleteModel, migrations.RenameModel)):
            assert (app, name, op.describe()) in DROPPED_A_RELEASE_LATER, (
                f"{app}/{name}: {op.describe()}: drop or rename only a release after the code "
                "stopped using it, and list it in DROPPED_A_RELEASE_LATER")
