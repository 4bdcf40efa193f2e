"""The flow-control migrations backwards and forwards again on SQLite, as `manage.py migrate`
runs them (each command its own process): to 0027 (0028-0035 undone: the claim indexes swapped
back, flow control's indexes and triggers dropped) and back to the head. The schema is then
the one a fresh `migrate` makes: every table, index and trigger, by name and definition."""

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]


def _migrate(db: Path, *target: str) -> None:
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{db}"}
    out = subprocess.run([sys.executable, "manage.py", "migrate", "-v0", *target], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr


def _schema(db: Path) -> set[tuple]:
    with sqlite3.connect(db) as conn:
        return set(conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master "
                                "WHERE name NOT LIKE 'sqlite_%'"))


@pytest.mark.skipif(connection.vendor != "sqlite",
                    reason="uses no database of the suite: run once, in the SQLite pass")
def test_the_flow_control_migrations_undo_and_redo_to_the_same_schema(tmp_path):
    fresh, roundtrip = tmp_path / "fresh.sqlite3", tmp_path / "roundtrip.sqlite3"
    _migrate(fresh)
    _migrate(roundtrip)
    _migrate(roundtrip, "jobqueue", "0027")
    undone = {name for _type, name, _table, _sql in _schema(roundtrip)}
    assert "job_rate_held_idx" not in undone and "rate_limit" not in undone
    assert "job_concurrency_moved" in undone  # 0027's own
    _migrate(roundtrip)
    assert _schema(roundtrip) == _schema(fresh)
