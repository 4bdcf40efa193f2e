"""The record of each maintenance run (maintenance_run), like reaper_run for the reaper.

An idle run (it found nothing to do) of a looping process extends that process's previous
idle row (runs + 1) instead of adding one, so that a loop every few seconds adds a row when
there was work, not on every pass."""

from __future__ import annotations

import os
import socket

from django.db.models import F
from django.db.models.functions import Now

from jobqueue.models import MaintenanceRun


def record(service: str, counts: dict, duration_seconds: float, *, dry_run: bool = False,
           idle: bool = False, idle_run_id: int | None = None) -> int:
    """Write (or extend) the run's row; return its id."""
    if idle and idle_run_id is not None and not dry_run:
        extended = MaintenanceRun.objects.filter(id=idle_run_id, service=service,
                                                 dry_run=False).update(
            runs=F("runs") + 1, finished_at=Now(), duration_seconds=duration_seconds)
        if extended:
            return idle_run_id
    run = MaintenanceRun.objects.create(
        service=service, finished_at=Now(), duration_seconds=duration_seconds, counts=counts,
        dry_run=dry_run, host=socket.gethostname()[:255], pid=os.getpid())
    return run.id


def last_runs(service: str) -> tuple[MaintenanceRun | None, MaintenanceRun | None]:
    """The service's latest run that worked, and its latest failure (for the Recovery page)."""
    runs = MaintenanceRun.objects.filter(service=service).order_by("-finished_at", "-id")
    return runs.filter(error="").first(), runs.exclude(error="").first()

def record_error(service: str, error: str) -> None:
    """A failed run: its own row, with the error (the reaper's too: the Recovery page lists
    maintenance_run for every service)."""
    MaintenanceRun.objects.create(service=service, finished_at=Now(), error=error[:2000],
                                  host=socket.gethostname()[:255], pid=os.getpid())
