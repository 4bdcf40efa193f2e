"""Database-clock expressions. Lease arithmetic never uses the app server's clock."""

from datetime import UTC

from django.db.models import DateTimeField, Func, IntegerField
from django.db.models.functions import Now


class NowPlusSeconds(Func):
    """now() + <seconds>, evaluated by the database. `seconds` is an int or an expression."""

    output_field = DateTimeField()
    arity = 1

    def __init__(self, seconds, **extra):
        from django.db.models import Value

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
        # Same text format as Django's Now() on SQLite, so comparisons stay textual-safe.
        return self.as_sql(
            compiler,
            connection,
            template="STRFTIME('%%%%Y-%%%%m-%%%%d %%%%H:%%%%M:%%%%f', 'NOW', "
            "(%(expressions)s) || ' seconds')",
            **extra_context,
        )


def db_now():
    """The database's current time, read with one query."""
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT STATEMENT_TIMESTAMP()")
            return cursor.fetchone()[0]
        cursor.execute("SELECT STRFTIME('%Y-%m-%d %H:%M:%f', 'NOW')")
        raw = cursor.fetchone()[0]
    from datetime import datetime

    return datetime.fromisoformat(raw).replace(tzinfo=UTC)


__all__ = ["Now", "NowPlusSeconds", "db_now"]
