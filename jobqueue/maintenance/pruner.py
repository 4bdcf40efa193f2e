"""Retention: delete finished jobs once their status's retention has passed (River's job
cleaner), with their events, claims and every other row that belongs to them.

Defaults (settings.JOBQUEUE, from the environment): successful and cancelled jobs are kept
RETENTION_DAYS (14) days, failure and expired RETENTION_FAILED_DAYS (30) days, after their
completed_at; 0 keeps that status forever. PRUNE_BATCH_SIZE (1000) jobs per transaction; the
maintenance loop prunes every PRUNE_INTERVAL_SECONDS (300). The
batch is lifecycle.prune (its guards: terminal, old enough, by the database's clock).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from django.db.models import Count

from jobqueue import states
from jobqueue.conf import jobqueue_settings
from jobqueue.lifecycle.prune import prunable, prune_finished_once

from . import run_records

SERVICE = "pruner"
DAY = 86400


@dataclass
class PruneResult:
    jobs: int = 0
    by_status: dict = field(default_factory=dict)
    batches: int = 0
    duration_seconds: float = 0.0
    dry_run: bool = False
    retention_days: dict = field(default_factory=dict)
    run_id: int | None = None

    def counts(self) -> dict:
        return {"jobs": self.jobs, "by_status": self.by_status, "batches": self.batches}

    def as_dict(self) -> dict:
        return {**self.counts(), "dry_run": self.dry_run,
                "duration_seconds": round(self.duration_seconds, 6),
                "retention_days": self.retention_days, "run_id": self.run_id}


def interval_seconds() -> float:
    return float(jobqueue_settings()["PRUNE_INTERVAL_SECONDS"])


def service_run(*, idle_run_id: int | None = None) -> tuple[dict, int | None, bool]:
    """run_once as the maintenance loop calls it: (counts, its run's row, idle)."""
    result = run_once(idle_run_id=idle_run_id)
    return result.counts(), result.run_id, result.jobs == 0


def retention_days(older_than_days: float | None = None) -> dict[str, float]:
    """Days each terminal status is kept (0: forever); `older_than_days` overrides all."""
    if older_than_days is not None:
        return {status: older_than_days for status in sorted(states.TERMINAL)}
    conf = jobqueue_settings()
    return {
        states.CANCELLED: conf["RETENTION_DAYS"],
        states.EXPIRED: conf["RETENTION_FAILED_DAYS"],
        states.FAILURE: conf["RETENTION_FAILED_DAYS"],
        states.SUCCESSFUL: conf["RETENTION_DAYS"],
    }


def _groups(days: dict[str, float]) -> list[tuple[list[str], int]]:
    """Statuses that share a cutoff, with the cutoff in seconds; kept-forever ones left out."""
    by_seconds: dict[int, list[str]] = {}
    for status, d in days.items():
        if d > 0:
            by_seconds.setdefault(round(d * DAY), []).append(status)
    return [(sorted(group), seconds) for seconds, group in sorted(by_seconds.items())]


def run_once(*, older_than_days: float | None = None, batch_size: int | None = None,
             max_batches: int | None = None, dry_run: bool = False, record: bool = True,
             idle_run_id: int | None = None,
             on_batch: Callable[[int, int], None] | None = None) -> PruneResult:
    """Delete (or, dry_run, count) what retention allows, `batch_size` jobs per transaction,
    at most `max_batches` batches in all; `on_batch(batches, jobs)` after each batch."""
    batch_size = batch_size or jobqueue_settings()["PRUNE_BATCH_SIZE"]
    started = time.monotonic()
    days = retention_days(older_than_days)
    result = PruneResult(dry_run=dry_run, retention_days=days)
    done: Counter = Counter()
    for statuses, seconds in _groups(days):
        if dry_run:
            rows = prunable(statuses, seconds).order_by().values("status").annotate(n=Count("id"))
            done.update({row["status"]: row["n"] for row in rows})
            continue
        while max_batches is None or result.batches < max_batches:
            batch = prune_finished_once(statuses, seconds, batch_size)
            if not batch:
                break
            result.batches += 1
            done.update(batch)
            if on_batch is not None:
                on_batch(result.batches, sum(done.values()))
            if sum(batch.values()) < batch_size:
                break
    result.by_status = dict(sorted(done.items()))
    result.jobs = sum(done.values())
    result.duration_seconds = time.monotonic() - started
    if record:
        result.run_id = run_records.record(SERVICE, result.counts(), result.duration_seconds,
                                       dry_run=dry_run, idle=result.jobs == 0,
                                       idle_run_id=idle_run_id)
    return result
