"""The database's clock. Lease arithmetic never uses the app server's clock.

On SQLite, Django stores datetimes as text (UTC) in SQLITE_DATETIME_FORMAT; the database's
clock is written in the same format, so that comparing it with stored values compares equal
texts. `sqlite_clock()` is that clock as SQL, for NowPlusSeconds (an ORM expression); the
hand-written statements write it whole (jobqueue/sql/sqlite.sql).
"""

from datetime import UTC, datetime

from django.db.models import DateTimeField, Func, IntegerField, Value
from django.db.models.functions import Now

SQLITE_DATETIME_FORMAT = "%Y-%m-%d %H:%M:%f"


def sqlite_clock(modifier: str = "", *, percent: str = "%%") -> str:
    """SQLite's now() (with a date modifier, e.g. "lease_seconds || ' seconds'") as SQL.

    `percent` is how a literal % is written where the text goes: "%%" in a statement run
    with parameters (Django's convention on every backend), "%%%%" in an expression
    template (which is %-formatted once more)."""
    fmt = SQLITE_DATETIME_FORMAT.replace("%", percent)
    return f"STRFTIME('{fmt}', 'NOW'" + (f", {modifier})" if modifier else ")")


def parse_db_datetime(value) -> datetime:
    """An aware UTC datetime from what a raw statement returns for a time: a datetime
    (PostgreSQL) or SQLite's text."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    return datetime.fromisoformat(value).replace(tzinfo=UTC)


class NowPlusSeconds(Func):
    """now() + <seconds>, evaluated by the database. `seconds` is an int or an expression."""

    output_field = DateTimeField()
    arity = 1

    def __init__(self, seconds, **extra):
        if isinstance(seconds, (int, float)):
            seconds = Value(seconds, output_field=IntegerField())
        super().__init__(seconds, **extra)

    def as_postgresql(self, compiler, connection, **extra_context):
        return self.as_sql(
            compiler,
            connection,
            template="(STATEMENT_TIMESTAMP() + make_interval(secs => %(expressions)s))",
            **extra_context,
        )

    def as_sqlite(self, compiler, connection, **extra_context):
        template = sqlite_clock("(%(expressions)s) || ' seconds'", percent="%%%%")
        return self.as_sql(compiler, connection, template=template, **extra_context)


def db_now():
    """The database's current time, read with one query (the backend's clock_now)."""
    from jobqueue.lifecycle.backends import backend

    return backend().now()


__all__ = ["Now", "NowPlusSeconds", "db_now", "parse_db_datetime", "sqlite_clock"]
