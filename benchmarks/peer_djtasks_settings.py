"""Minimal Django project for the django-tasks-db peer (used only with .venv-bench).

BENCH_DJTASKS_CONN_MAX_AGE (JSON: a number of seconds or null for unlimited) is the
worker's CONN_MAX_AGE; benchmarks.peers sets it from the peer's configuration.
"""

import json
import os
from urllib.parse import urlparse

_url = urlparse(os.environ["DATABASE_URL"])
SECRET_KEY = "bench-only"
INSTALLED_APPS = ["django_tasks", "django_tasks_db"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _url.path.lstrip("/"),
        "USER": _url.username or "postgres",
        "HOST": _url.hostname or "127.0.0.1",
        "PORT": str(_url.port or 5432),
        "CONN_MAX_AGE": json.loads(os.environ.get("BENCH_DJTASKS_CONN_MAX_AGE", "0")),
    }
}
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
