"""Fail early, with a short hint, when the PostgreSQL a command needs is not there.

    python scripts/check_postgres.py URL               # make test, make bench: the server
    python scripts/check_postgres.py --database URL    # make run, make migrate: the database

The first checks the server through its `postgres` database (pytest creates its own
test_<name> database). The second also checks that URL's database exists, and says how to
create it when it does not: `make run` would otherwise end in Django's long traceback. URLs
of other databases (sqlite://) pass. Passwords are never printed.
"""

import sys
from urllib.parse import unquote, urlsplit, urlunsplit

import psycopg

SCHEMES = {"postgres", "postgresql", "pgsql", "psql"}  # django-environ's names for it


def shown(parts) -> str:
    """The URL without its password."""
    host = parts.hostname or "localhost"
    user = f"{parts.username}@" if parts.username else ""
    port = f":{parts.port}" if parts.port else ""
    return f"postgres://{user}{host}{port}{parts.path}"


def main(argv: list[str]) -> int:
    check_database = argv[:1] == ["--database"]
    args = argv[1:] if check_database else argv
    url = args[0] if args else "postgres://postgres@127.0.0.1:5432/postgres"
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        return 0
    name = unquote(parts.path.lstrip("/")) or "postgres"
    server = parts._replace(scheme="postgresql", path="/postgres")
    try:
        with psycopg.connect(urlunsplit(server), connect_timeout=5) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                                  [name]).fetchone()
    except Exception as exc:  # noqa: BLE001 - any failure gets the same hint
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        sys.stderr.write(
            f"\nPostgreSQL is unreachable at {shown(server)}: {reason}\n"
            "Start a server, for example\n"
            "  pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start\n"
            + ("or point DATABASE_URL at one (or unset it: SQLite).\n" if check_database else
               "or point TEST_DATABASE_URL at one: make test "
               "TEST_DATABASE_URL=postgres://user@host/db\n")
        )
        return 2
    if check_database and not exists:
        host = parts.hostname or "localhost"
        flags = f"-h {host}" + (f" -p {parts.port}" if parts.port else "") + \
            (f" -U {parts.username}" if parts.username else "")
        sys.stderr.write(
            f'\nThe database "{name}" does not exist on {shown(server)[:-len("/postgres")]}.\n'
            f"Create it (the service makes its tables), then run again:  "
            f"createdb {flags} {name}\n"
        )
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
