import pytest
from django.db import connection


def pytest_report_header(config):
    from django.conf import settings

    db = settings.DATABASES["default"]
    return f"database: {db['ENGINE'].rsplit('.', 1)[-1]} {db.get('NAME')}"


@pytest.fixture(autouse=True, scope="session")
def _static_files_without_collectstatic(tmp_path_factory):
    """Deployments use whitenoise's manifest storage, which needs `collectstatic` before any
    page renders. Tests render the admin straight from the apps' static folders instead
    (tests/ops checks collectstatic and the manifest storage for real)."""
    from pathlib import Path

    from django.conf import settings
    from django.test import override_settings

    # whitenoise warns at every request handler's start when STATIC_ROOT does not exist yet.
    Path(settings.STATIC_ROOT).mkdir(parents=True, exist_ok=True)
    with override_settings(
        STORAGES={
            "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
            "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
            # Job artifacts in a directory of this test session's own.
            "artifacts": {"BACKEND": "django.core.files.storage.FileSystemStorage",
                          "OPTIONS": {"location": str(tmp_path_factory.mktemp("artifacts"))}},
        }
    ):
        yield


@pytest.fixture
def own_artifact_storage(settings, tmp_path):
    """This test's job artifacts in a directory of its own (returned), not the session's."""
    location = tmp_path / "artifacts"
    location.mkdir()
    settings.STORAGES = {**settings.STORAGES, "artifacts": {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": str(location)}}}
    return location


@pytest.fixture
def wakeups_stopped_after(request, django_db_setup):
    """For modules whose tests wait: the process's wake-up thread (and its LISTEN connection)
    ends with each test, before pytest-django empties the test database (a transactional
    test's TRUNCATE) or drops it. The thread re-checks the waiters' jobs as soon as it has
    connected: a re-check still running while the TRUNCATE took its locks deadlocked with it
    (CI, once), and one running after the test touched a database the test no longer owned."""
    if request.node.get_closest_marker("django_db") or (
            {"db", "transactional_db", "live_server"} & set(request.fixturenames)):
        # Set up before this fixture, so torn down (the flush) after it.
        request.getfixturevalue("_django_db_helper")
    yield
    from jobqueue import wakeups

    wakeups.reset()


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
