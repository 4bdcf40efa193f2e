"""config/settings.py refuses a setting it cannot use at start, with a message that names it
(a fresh interpreter: the settings module is read once per process)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_min_client_version_that_is_not_major_minor_stops_the_start():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings",
           "JOBQUEUE_MIN_CLIENT_VERSION": "latest"}
    proc = subprocess.run([sys.executable, "-c", "import django; django.setup()"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "ImproperlyConfigured: JOBQUEUE_MIN_CLIENT_VERSION must be MAJOR.MINOR, e.g. 0.2" \
        in proc.stderr
