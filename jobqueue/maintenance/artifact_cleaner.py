"""Artifact clean-up as a maintenance service: the files and rows of artifacts that can never
be published (lifecycle.artifacts.clean_artifacts: attempts that did not succeed, interrupted
uploads, replaced files), ARTIFACT_CLEAN_BATCH_SIZE (500) per batch, every
ARTIFACT_CLEAN_INTERVAL_SECONDS (300); recorded in maintenance_run like the pruner."""

from __future__ import annotations

import time

from jobqueue.conf import jobqueue_settings
from jobqueue.lifecycle.artifacts import CleanResult, clean_artifacts

from . import run_records

SERVICE = "artifact_cleaner"


def interval_seconds() -> float:
    return float(jobqueue_settings()["ARTIFACT_CLEAN_INTERVAL_SECONDS"])


def run_once(batch_size: int | None = None, **options) -> CleanResult:
    """One clean-up with clean_artifacts' options (max_batches, dry_run, on_batch), not
    recorded; its counts are `deleted` and `batches`."""
    return clean_artifacts(batch_size or jobqueue_settings()["ARTIFACT_CLEAN_BATCH_SIZE"],
                           **options)


def service_run(*, idle_run_id: int | None = None) -> tuple[dict, int | None, bool]:
    """One clean-up as the maintenance loop calls it: (counts, its run's row, idle)."""
    started = time.monotonic()
    result = run_once()
    counts = {"deleted": result.deleted, "batches": result.batches}
    idle = result.deleted == 0
    run_id = run_records.record(SERVICE, counts, time.monotonic() - started, idle=idle,
                            idle_run_id=idle_run_id)
    return counts, run_id, idle
