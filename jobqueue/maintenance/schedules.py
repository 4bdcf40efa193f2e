"""Schedules as a maintenance service: fires every due schedule (lifecycle.schedules.
fire_due_schedules), SCHEDULE_BATCH_SIZE (100) schedules per transaction, every
SCHEDULE_INTERVAL_SECONDS (5); recorded in maintenance_run like the other services. Safe in
several loops at once: each fire time is handled once (the lifecycle module says how)."""

from __future__ import annotations

import time

from jobqueue.conf import jobqueue_settings
from jobqueue.lifecycle.schedules import fire_due_schedules

from . import run_records

SERVICE = "schedules"


def interval_seconds() -> float:
    return float(jobqueue_settings()["SCHEDULE_INTERVAL_SECONDS"])


def run_once(batch_size: int | None = None) -> dict:
    """Fire every due schedule; counts: schedules handled, fire times fired, skipped, missed."""
    return fire_due_schedules(batch_size or jobqueue_settings()["SCHEDULE_BATCH_SIZE"])


def service_run(*, idle_run_id: int | None = None) -> tuple[dict, int | None, bool]:
    """run_once as the maintenance loop calls it: (counts, its run's row, idle)."""
    started = time.monotonic()
    counts = run_once()
    idle = counts["schedules"] == 0
    run_id = run_records.record(SERVICE, counts, time.monotonic() - started, idle=idle,
                                idle_run_id=idle_run_id)
    return counts, run_id, idle
