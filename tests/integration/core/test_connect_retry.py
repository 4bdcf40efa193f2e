"""DATABASE_CONNECT_RETRY_SECONDS (config/postgresql): a refused new connection is tried
again for that long, then fails as before; and JOBQUEUE_PREPARED_STATEMENTS=0 prepares
nothing on a connection."""

import threading
import time

import pytest
from django.db import connection
from django.db.utils import OperationalError

from config.postgresql.base import DatabaseWrapper
from jobqueue import lifecycle, states
from tests.e2e.harness import free_port
from tests.factories import JobAgentFactory, JobFactory
from tests.netproxy import TcpProxy

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]


def _wrapper(port, retry):
    settings = {**connection.settings_dict, "HOST": "127.0.0.1", "PORT": port,
                "CONNECT_RETRY_SECONDS": retry, "OPTIONS": {
                    **connection.settings_dict["OPTIONS"], "connect_timeout": 2}}
    return DatabaseWrapper(settings, alias="retry-test")


def test_a_refused_connection_is_retried_until_the_server_is_back(caplog):
    s = connection.settings_dict
    port = free_port()
    proxy = TcpProxy(s.get("HOST") or "127.0.0.1", int(s.get("PORT") or 5432), listen_port=port)
    # The "restart": nothing listens on the port for 0.5 s, then the proxy does.
    timer = threading.Timer(0.5, proxy.start)
    timer.start()
    db = _wrapper(port, 5)
    try:
        t0 = time.monotonic()
        db.ensure_connection()
        waited = time.monotonic() - t0
        with db.cursor() as cur:
            cur.execute("SELECT 1")
            assert cur.fetchone() == (1,)
    finally:
        timer.join()
        db.close()
        proxy.stop()
    assert 0.4 < waited < 5
    assert "database connection opened after" in caplog.text


def test_past_its_budget_the_error_is_raised_as_before():
    db = _wrapper(free_port(), 0.35)
    t0 = time.monotonic()
    with pytest.raises(OperationalError):
        db.ensure_connection()
    assert 0.2 < time.monotonic() - t0 < 3
    # Without a budget: at once.
    db = _wrapper(free_port(), 0)
    t0 = time.monotonic()
    with pytest.raises(OperationalError):
        db.ensure_connection()
    assert time.monotonic() - t0 < 1


def _prepared_after_a_cycle() -> int:
    connection.close()  # a new connection: a new hot cursor, chosen by the setting
    agent = JobAgentFactory()
    JobFactory(job_agent=agent)
    grant = lifecycle.claim_next_job(agent)
    lifecycle.report_status(grant.job.id, grant.claim_id, states.SUCCESSFUL)
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_prepared_statements")
        return cur.fetchone()[0]


def test_prepared_statements_can_be_turned_off(settings):
    assert _prepared_after_a_cycle() >= 2  # the claim and the report
    settings.JOBQUEUE = {**settings.JOBQUEUE, "PREPARED_STATEMENTS": False}
    try:
        assert _prepared_after_a_cycle() == 0
    finally:
        connection.close()
