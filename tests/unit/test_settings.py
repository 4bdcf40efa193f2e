"""config/settings.py: it refuses a setting it cannot use at start, with a message that names
it (a fresh interpreter: the settings module is read once per process); the local secret key
file another process is still writing is waited for."""

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from config.settings import _local_secret_key

ROOT = Path(__file__).resolve().parents[2]


def test_a_min_client_version_that_is_not_major_minor_stops_the_start():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings",
           "JOBQUEUE_MIN_CLIENT_VERSION": "latest"}
    proc = subprocess.run([sys.executable, "-c", "import django; django.setup()"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "ImproperlyConfigured: JOBQUEUE_MIN_CLIENT_VERSION must be MAJOR.MINOR, e.g. 0.2" \
        in proc.stderr


def test_a_secret_key_file_being_written_is_waited_for(tmp_path):
    path = tmp_path / "secret_key"
    path.write_text("")  # another process made it and is writing it right now
    writer = threading.Timer(0.1, lambda: path.write_text("the-key\n"))
    writer.start()
    try:
        assert _local_secret_key(path) == "the-key"
    finally:
        writer.join()
    # One that stays empty (a writer that died): the error, after a second.
    path.write_text("")
    with pytest.raises(FileExistsError):
        _local_secret_key(path)
