"""/healthz answers whether the database is reachable and the server's version, nothing else."""

import contextlib
import json
import socket
import uuid

import pytest
from django.db import connection

import jobqueue
from agents.health import note_token_used

pytestmark = pytest.mark.django_db(transaction=True)


@contextlib.contextmanager
def database_unreachable(tmp_path):
    """Point the default connection at a database that cannot be reached (a closed port on
    PostgreSQL, a file in a missing directory on SQLite), for real, then put it back."""
    saved = dict(connection.settings_dict)
    connection.close()
    if connection.vendor == "postgresql":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]  # closed again when we leave: nothing listens there
        connection.settings_dict.update(HOST="127.0.0.1", PORT=port)
        connection.settings_dict["OPTIONS"] = {**saved["OPTIONS"], "connect_timeout": 2}
    else:
        connection.settings_dict["NAME"] = str(tmp_path / "missing-dir" / "db.sqlite3")
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(saved)


def test_healthz_ok(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert json.loads(response.content) == {"status": "ok", "version": jobqueue.__version__}
    assert "no-cache" in response["Cache-Control"]


def test_healthz_503_when_the_database_is_unreachable(client, tmp_path):
    with database_unreachable(tmp_path):
        response = client.get("/healthz")
    assert response.status_code == 503
    body = json.loads(response.content)
    # no error text, host or port
    assert body == {"status": "unavailable", "version": jobqueue.__version__}
    # And it recovers as soon as the database answers again.
    assert client.get("/healthz").status_code == 200


def test_metrics_say_database_down_instead_of_failing(client, tmp_path):
    with database_unreachable(tmp_path):
        response = client.get("/metrics")
    assert response.status_code == 200
    assert "jobqueue_database_up 0.0" in response.content.decode()


def test_healthz_only_answers_get(client):
    assert client.post("/healthz").status_code == 405


def test_last_seen_that_cannot_be_written_is_only_logged(tmp_path, caplog):
    """An agent's request goes on when its last_seen_at cannot be written (the database
    went away between the request's own queries and this one)."""
    agent_id = uuid.uuid4()
    with database_unreachable(tmp_path):
        assert note_token_used(uuid.uuid4(), agent_id) is False
    assert f"could not record last_seen_at for job agent {agent_id}" in caplog.text
