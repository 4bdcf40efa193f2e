"""Fail early, with a hint, when the PostgreSQL that the tests need is unreachable."""

import sys

import psycopg

url = sys.argv[1] if len(sys.argv) > 1 else "postgres://postgres@127.0.0.1:5432/postgres"
# pytest creates its own test_<name> database, so check the server through `postgres`.
server_url = url.rsplit("/", 1)[0] + "/postgres"
try:
    with psycopg.connect(server_url, connect_timeout=5) as conn:
        conn.execute("SELECT 1")
except Exception as exc:  # noqa: BLE001 - any failure gets the same hint
    sys.stderr.write(
        f"\nPostgreSQL is unreachable at {server_url}: {exc}\n"
        "The test suite runs on SQLite and on PostgreSQL. Start a server, for example\n"
        "  pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start\n"
        "or point TEST_DATABASE_URL at one: make test TEST_DATABASE_URL=postgres://user@host/db\n"
    )
    sys.exit(2)
