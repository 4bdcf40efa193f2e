"""The backend is chosen by the connection's vendor (no database)."""

import pytest
from django.core.exceptions import ImproperlyConfigured

from jobqueue.lifecycle import backends


class Connection:
    def __init__(self, vendor):
        self.vendor = vendor


def test_each_supported_vendor_has_its_backend():
    assert type(backends._for(Connection("postgresql"))).__name__ == "PostgresBackend"
    assert type(backends._for(Connection("sqlite"))).__name__ == "SqliteBackend"


def test_another_database_is_refused_with_a_clear_error():
    with pytest.raises(ImproperlyConfigured, match="PostgreSQL or SQLite, not mysql"):
        backends._for(Connection("mysql"))
