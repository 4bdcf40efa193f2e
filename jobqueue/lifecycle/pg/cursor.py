"""The hot paths' psycopg cursor: one per connection, server-side binding, prepared statements.

Each statement's text never varies with the values (jobqueue/sql/postgresql.sql), so it is
prepared once per connection and a claim or report skips parsing and planning its CTE: about a
sixth of its cost (docs/performance.md). `DATABASES["default"]["OPTIONS"]["prepare_threshold"]`
(config/settings.py) lets psycopg honour `prepare=True`; a threshold never reached keeps
its automatic preparing off for every other query.

A statement runs through Django's own cursor wrapper around this cached cursor, as any
`connection.cursor()` query does: the health check and reconnect, errors wrapped as
django.db errors, the broken-transaction check, `execute_wrapper()`s, and query logging
(DEBUG, CaptureQueriesContext) are Django's, and the path is the same whether or not queries
are logged. What it saves is a new cursor and a column description per call (a tenth of a
claim's client time) and Django's pure-Python timestamptz loader.

Unprepared (JOBQUEUE_PREPARED_STATEMENTS=0, behind a transaction-mode pooler), a statement
that has a PL/pgSQL wrapper installed (pg/functions.py) runs as a call of it, whose plans the
server keeps: the wrappers of the text this code runs, looked up once per connection. A call
is bound client-side (psycopg quotes the values), so it goes as one simple query.
"""

from __future__ import annotations

from jobqueue.sql import postgresql as sql

_preparing_cursor_class = None


def _preparing_cursor(conn):
    """A psycopg cursor with server-side binding whose statements are prepared."""
    global _preparing_cursor_class
    if _preparing_cursor_class is None:
        from django.db.backends.postgresql.base import ServerBindingCursor

        class PreparingCursor(ServerBindingCursor):
            def execute(self, query, params=None, *, prepare=None, binary=None):
                prepare = True if prepare is None else prepare
                return super().execute(query, params, prepare=prepare, binary=binary)

        _preparing_cursor_class = PreparingCursor
    return _preparing_cursor_class(conn)


def new_cursor(raw_conn, *, client_binding: bool = False):
    from django.db.backends.postgresql.base import Cursor, ServerBindingCursor
    from psycopg.types.datetime import TimestamptzLoader

    from jobqueue.conf import jobqueue_settings

    # JOBQUEUE_PREPARED_STATEMENTS=0 (a transaction-mode pooler): the same statements,
    # bound on the server in unnamed statements, which PgBouncer 1.18 passes through; the
    # calls of their wrappers bound here (client_binding), which sends each as one simple
    # query: a fifth less of the server's time than the extended protocol's unnamed
    # statement for so short a statement (docs/performance.md, "Behind PgBouncer").
    if client_binding:
        cur = Cursor(raw_conn)
    elif jobqueue_settings()["PREPARED_STATEMENTS"]:
        cur = _preparing_cursor(raw_conn)
    else:
        cur = ServerBindingCursor(raw_conn)
    # psycopg's own timestamptz loader (its C version) instead of Django's pure-Python
    # subclass: it yields the session's time zone, which Django keeps equal to
    # db.timezone; pg/rows.py then sets db.timezone's tzinfo as Django's would.
    cur.adapters.register_loader("timestamptz", TimestamptzLoader)
    return cur


_debug_wrapper_class = None


def _debug_wrapper(raw, db):
    """Django's CursorDebugWrapper, logging the statement's own text: a prepared statement
    leaves psycopg no query text for Django's last_executed_query() to read."""
    global _debug_wrapper_class
    if _debug_wrapper_class is None:
        from django.db.backends.utils import CursorDebugWrapper

        class StatementDebugWrapper(CursorDebugWrapper):
            def execute(self, sql, params=None):
                with self.debug_sql(sql, params):
                    return self._execute_with_wrappers(
                        sql, params, many=False, executor=self._execute
                    )

        _debug_wrapper_class = StatementDebugWrapper
    return _debug_wrapper_class(raw, db)


class HotCursor:
    """The cached cursor of one Django connection (a connection opened after a drop gets a
    new one)."""

    def __init__(self, db):
        self.db = db
        self._conn = None
        self._cursor = None
        self._calls = None  # {statement: the call of its wrapper}, per connection
        self._client = None  # the calls' cursor (client-side binding)

    def _raw(self):
        conn = self.db.connection
        if self._cursor is None or self._conn is not conn or self._cursor.closed:
            self._cursor = new_cursor(conn)
            self._conn = conn
            self._calls = self._client = None
        return self._cursor

    def _wrapped(self, raw):
        """Django's wrapper of a raw cursor, as db.cursor() makes it."""
        db = self.db
        return _debug_wrapper(raw, db) if db.queries_logged else db.make_cursor(raw)

    def _wrapper_calls(self, raw) -> dict:
        """{statement: the call of its wrapper} of the wrappers installed, unprepared; {}
        when statements are prepared (they keep their plans themselves)."""
        from jobqueue.conf import jobqueue_settings

        from .functions import call, wrapped

        if jobqueue_settings()["PREPARED_STATEMENTS"]:
            return {}
        statements = wrapped()
        self._wrapped(raw).execute(sql.function_list_installed, {"names": list(statements)})
        with self.db.wrap_database_errors:
            found = {name for name, _digest in raw.fetchall()}
            self._client = new_cursor(self._conn, client_binding=True)
        return {text: call(name, text) for name, text in statements.items() if name in found}

    def run(self, statement: str, params: dict) -> tuple:
        """Execute one statement: (the cursor, for its description; the rows)."""
        db = self.db
        db.close_if_health_check_failed()  # as db.cursor() does (CONN_HEALTH_CHECKS)
        db.ensure_connection()
        with db.wrap_database_errors:
            raw = self._raw()
        db.validate_thread_sharing()
        if self._calls is None:
            self._calls = self._wrapper_calls(raw)
        call = self._calls.get(statement)
        if call is not None:
            statement, raw = call, self._client
        self._wrapped(raw).execute(statement, params)
        with db.wrap_database_errors:
            return raw, raw.fetchall()
