"""Job instances from the rows of the hot statements, without Django's per-row overhead.

Each statement's column layout and the fields' converters are worked out once (per
connection alias and statement), then every row becomes a Job as Model.from_db() would build
it: the fields' own converters, db.timezone's tzinfo on every time.
"""

from __future__ import annotations

from django.db.models import DateTimeField
from django.db.models.base import ModelState

from jobqueue.models import Job

_COLUMNS: dict = {}  # (alias, sql) -> the statement's column names (its text names them)
_ROW_LAYOUTS: dict = {}  # (alias, columns, extra) -> where each field is and its converters


def columns(db, sql: str, cursor) -> tuple[str, ...]:
    key = (db.alias, sql)
    names = _COLUMNS.get(key)
    if names is None:
        names = _COLUMNS[key] = tuple(col.name for col in cursor.description)
    return names


def jobs_from_rows(db, columns, rows: list[tuple], *extra: str) -> list[Job]:
    """Job instances (with the fields' own converters) from rows naming the job's columns;
    each name in `extra` (a time, e.g. db_now) becomes an attribute of the instance."""
    key = (db.alias, columns, extra)
    cached = _ROW_LAYOUTS.get(key)
    if cached is None:
        plain, times, converted = [], [], []
        for f in Job._meta.concrete_fields:
            converters = f.get_db_converters(db)
            at = columns.index(f.column)
            if converters:
                converted.append((f.attname, at, converters, f.cached_col))
            elif isinstance(f, DateTimeField):
                times.append((f.attname, at))
            else:
                plain.append((f.attname, at))
        times += [(name, columns.index(name)) for name in extra]
        cached = _ROW_LAYOUTS[key] = (plain, times, converted)
    plain, times, converted = cached
    tz = db.timezone
    jobs = []
    for row in rows:
        values = {name: row[at] for name, at in plain}
        for name, at in times:
            value = row[at]
            values[name] = None if value is None else value.astimezone(tz)
        for name, at, converters, col in converted:
            value = row[at]
            for convert in converters:
                value = convert(value, col, db)
            values[name] = value
        jobs.append(_loaded_job(db.alias, values))
    return jobs


def _loaded_job(alias: str, values: dict) -> Job:
    """A Job as Model.from_db() builds it from a full row, minus the per-field setattr loop
    and the pre_init/post_init signals (no receiver in this project listens to Job)."""
    job = Job.__new__(Job)
    job.__dict__.update(values)
    state = ModelState()
    state.adding = False
    state.db = alias
    job._state = state
    return job
