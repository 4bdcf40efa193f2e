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
