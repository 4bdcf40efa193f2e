"""Django's PostgreSQL backend, with new connections retried for a bounded time.

DATABASE_CONNECT_RETRY_SECONDS (settings: DATABASES["default"]["CONNECT_RETRY_SECONDS"]) > 0
selects this backend: a connection that is refused or fails while opening is tried again
every 0.1 s until that many seconds have passed, then the error is raised as before. A
pooler or server restart shorter than that (PgBouncer's takes a fraction of a second) then
costs requests a short wait instead of a 500. Only opening a connection is retried, never a
statement: whether a statement sent on a connection that broke took effect is unknown.
"""

import logging
import time

import psycopg
from django.db.backends.postgresql import base

log = logging.getLogger("config.postgresql")

RETRY_INTERVAL_SECONDS = 0.1


class DatabaseWrapper(base.DatabaseWrapper):
    def get_new_connection(self, conn_params):
        budget = float(self.settings_dict.get("CONNECT_RETRY_SECONDS") or 0)
        deadline = time.monotonic() + budget
        tries = 0
        while True:
            try:
                connection = super().get_new_connection(conn_params)
            except psycopg.OperationalError:
                if time.monotonic() + RETRY_INTERVAL_SECONDS > deadline:
                    raise
                tries += 1
                time.sleep(RETRY_INTERVAL_SECONDS)
                continue
            if tries:
                log.warning("database connection opened after %d retries", tries)
            return connection
