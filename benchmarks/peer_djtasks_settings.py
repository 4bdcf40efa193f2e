"""Minimal Django project for the django-tasks-db peer (used only with .venv-bench)."""

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
    }
}
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
