"""The group watcher as a maintenance service: marks groups whose last live job has ended
finished and writes their `group.finished` webhook deliveries (lifecycle.groups.
mark_finished_groups), GROUP_WATCH_BATCH_SIZE (500) groups per transaction, every
GROUP_WATCH_INTERVAL_SECONDS (5); recorded in maintenance_run like the other services."""

from __future__ import annotations

import time

from jobqueue.conf import jobqueue_settings
from jobqueue.lifecycle.groups import mark_finished_groups

from . import run_records

SERVICE = "group_watcher"


def interval_seconds() -> float:
    return float(jobqueue_settings()["GROUP_WATCH_INTERVAL_SECONDS"])


def run_once(batch_size: int | None = None) -> dict:
    """Mark every group that has finished; counts: groups marked (of them, cancelled)."""
    marked = mark_finished_groups(batch_size or jobqueue_settings()["GROUP_WATCH_BATCH_SIZE"])
    return {"finished": len(marked),
            "cancelled": sum(1 for g in marked if g.cancelled_at is not None)}


def service_run(*, idle_run_id: int | None = None) -> tuple[dict, int | None, bool]:
    """run_once as the maintenance loop calls it: (counts, its run's row, idle)."""
    started = time.monotonic()
    counts = run_once()
    idle = counts["finished"] == 0
    run_id = run_records.record(SERVICE, counts, time.monotonic() - started, idle=idle,
                            idle_run_id=idle_run_id)
    return counts, run_id, idle
