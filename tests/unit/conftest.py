"""The unit layer needs no database at all: pure helpers, the client library, the agent's
pieces. `make test` runs it first, on its own, before the two database passes.

Any database access fails here: pytest-django blocks connections for tests without its
`django_db` mark, and this conftest refuses, at collection, a test that asks for a database
(the mark, or the db / transactional_db / live_server fixtures): such a test belongs in
tests/integration."""

from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parent

DATABASE_FIXTURES = {"db", "transactional_db", "django_db_setup", "live_server",
                     "django_db_reset_sequences", "django_db_serialized_rollback"}


def _asks_for_a_database(item) -> bool:
    return (item.get_closest_marker("django_db") is not None
            or bool(DATABASE_FIXTURES & set(getattr(item, "fixturenames", ()))))


def pytest_collection_modifyitems(config, items):
    # A conftest's hooks see the whole session's items: judge only this layer's.
    wrong = [item.nodeid for item in items
             if UNIT in Path(item.path).resolve().parents and _asks_for_a_database(item)]
    if wrong:
        raise pytest.UsageError(
            "tests/unit needs no database; move these to tests/integration: " + ", ".join(wrong))


@pytest.fixture(autouse=True)
def _no_database(django_db_blocker):
    """Explicit: even a helper that opens a connection on its own is refused."""
    django_db_blocker.block()
    try:
        yield
    finally:
        django_db_blocker.restore()
