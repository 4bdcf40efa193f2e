"""Building an index of `job` on PostgreSQL without holding its claims and reports: CREATE
INDEX CONCURRENTLY (after dropping an INVALID one a failed build left behind), and the swap of
a claim index for its new definition under the same name (built beside it, the old one dropped,
the new one renamed: a claim always has one). Migrations 0028, 0030 and 0032 (run outside a
transaction: `atomic = False`)."""


def concurrently(model, schema_editor, index, name=None):
    if name is not None:
        index = index.clone()
        index.name = name
    schema_editor.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{index.name}"')
    schema_editor.execute(str(index.create_sql(model, schema_editor, concurrently=True)))


def swap(model, schema_editor, new, old):
    """Build `new` beside `old` (same name), drop `old`, give `new` its name."""
    concurrently(model, schema_editor, new, name=f"{new.name}_next")
    schema_editor.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{old.name}"')
    schema_editor.execute(f'ALTER INDEX "{new.name}_next" RENAME TO "{new.name}"')


def rebuild(apps, schema_editor, swaps, added):
    """A migration's forwards: each claim index of `swaps` ((new, old) under one name) swapped
    for its new definition, then the `added` indexes built; CONCURRENTLY on PostgreSQL, plain
    on SQLite (its writers are serialized: nothing waits on a build)."""
    model = apps.get_model("jobqueue", "Job")
    if schema_editor.connection.vendor == "postgresql":
        for new, old in swaps:
            swap(model, schema_editor, new, old)
        for index in added:
            concurrently(model, schema_editor, index)
        return
    for new, old in swaps:
        schema_editor.remove_index(model, old)
        schema_editor.add_index(model, new)
    for index in added:
        schema_editor.add_index(model, index)


def unbuild(apps, schema_editor, swaps, added):
    """`rebuild` undone: the `added` indexes dropped, each claim index swapped back."""
    model = apps.get_model("jobqueue", "Job")
    if schema_editor.connection.vendor == "postgresql":
        for index in added:
            schema_editor.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{index.name}"')
        for new, old in reversed(swaps):
            swap(model, schema_editor, old, new)
        return
    for index in added:
        schema_editor.remove_index(model, index)
    for new, old in swaps:
        schema_editor.remove_index(model, new)
        schema_editor.add_index(model, old)
