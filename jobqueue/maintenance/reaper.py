"""The reaper as a maintenance service: one sweep (jobqueue.reaper.sweep), recorded in
reaper_run exactly as `reap_claims` records it. Runs every REAPER_INTERVAL_SECONDS (5)."""

from __future__ import annotations

from jobqueue import reaper
from jobqueue.conf import jobqueue_settings

SERVICE = "reaper"


def interval_seconds() -> float:
    return float(jobqueue_settings()["REAPER_INTERVAL_SECONDS"])


def service_run(*, idle_run_id: int | None = None) -> tuple[dict, int | None, bool]:
    """One sweep: (its counts, its reaper_run row, whether it was idle)."""
    result = reaper.sweep(idle_run_id=idle_run_id)
    counts = {"requeued": result.requeued, "expired": result.expired, "batches": result.batches}
    return counts, result.run_id, not (result.requeued or result.expired)


def run_once(**options) -> reaper.SweepResult:
    """One sweep with reap_claims' options (batch_size, max_batches, dry_run, ...)."""
    return reaper.sweep(**options)
