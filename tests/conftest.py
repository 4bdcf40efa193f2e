import pytest
from django.db import connection


def pytest_report_header(config):
    from django.conf import settings

    db = settings.DATABASES["default"]
    return f"database: {db['ENGINE'].rsplit('.', 1)[-1]} {db.get('NAME')}"


@pytest.fixture
def is_postgres():
    return connection.vendor == "postgresql"


def pytest_collection_modifyitems(config, items):
    """PostgreSQL-only checks (row locks, system columns, EXPLAIN) are deselected, not
    skipped, in the SQLite pass; `make test` runs both passes."""
    if connection.vendor == "postgresql":
        return
    keep, drop = [], []
    for item in items:
        (drop if "postgres_only" in item.keywords else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
