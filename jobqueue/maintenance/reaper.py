"""The reaper, a maintenance service like the others: returns jobs whose lease (or
max_runtime_seconds) ran out to the queue, or ends them as `expired`; ends jobs past their
expires_at (docs/clocks.md). The loop (run_maintenance, loop.py) sweeps every
REAPER_INTERVAL_SECONDS (5); `reap_claims` runs one sweep, or with --loop the same loop with
this one service (Sweeps: its --batch-size and --max-batches).

One sweep runs bounded batches (lifecycle.reap) until nothing is left or `max_batches` is
reached; each sweep is recorded as a ReaperRun (reaper_run, not maintenance_run) so that
operators can see when the reaper last ran. Several reapers may run at once: batches take job
rows with SKIP LOCKED.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.db.models import F
from django.db.models.functions import Now

from jobqueue import lifecycle
from jobqueue.actors import REAPER
from jobqueue.conf import jobqueue_settings
from jobqueue.lifecycle import concurrency, ratelimits
from jobqueue.models import ReaperRun

log = logging.getLogger("jobqueue.reaper")
SERVICE = "reaper"


@dataclass
class SweepResult:
    requeued: int = 0
    expired: int = 0
    batches: int = 0
    duration_seconds: float = 0.0
    dry_run: bool = False
    run_id: int | None = None

    def as_dict(self) -> dict:
        return {
            "requeued": self.requeued,
            "expired": self.expired,
            "batches": self.batches,
            "duration_seconds": round(self.duration_seconds, 6),
            "dry_run": self.dry_run,
            "run_id": self.run_id,
        }


def sweep(*, batch_size: int | None = None, max_batches: int | None = None,
          dry_run: bool = False, record: bool = True, actor: str = REAPER,
          idle_run_id: int | None = None,
          on_batch: Callable[[int, int], None] | None = None) -> SweepResult:
    """Reap every expired claim, `batch_size` per transaction, at most `max_batches`.

    `actor` names who reaped in the job events ("operator:<username>" from the admin).
    `idle_run_id`: the row of this process's previous sweep when that one reaped nothing;
    an idle sweep then extends that row (sweeps + 1) instead of adding one, so a reaper
    looping every few seconds does not grow reaper_run by thousands of rows a day.
    `on_batch(batches, claims reaped)` after each batch."""
    batch_size = batch_size or jobqueue_settings()["REAPER_BATCH_SIZE"]
    started = time.monotonic()
    result = SweepResult(dry_run=dry_run)
    if dry_run:
        counts = lifecycle.count_expired_claims()
        result.requeued = counts["would_requeue"]
        result.expired = counts["would_expire"]
    else:
        # Expired claims (the lease, max_runtime_seconds, a running job's expires_at) and
        # jobs that expired before they ran, a batch of each in turn while one may be left.
        todo = [lifecycle.reap_expired_claims_once, lifecycle.expire_overdue_jobs_once]
        while todo and (max_batches is None or result.batches < max_batches):
            reap = todo.pop(0)
            batch = reap(batch_size, actor=actor)
            if batch.batches == 0:
                continue
            result.batches += 1
            result.requeued += batch.requeued
            result.expired += batch.expired
            if on_batch is not None:
                on_batch(result.batches, result.requeued + result.expired)
            if batch.reaped >= batch_size:
                todo.append(reap)
        # A concurrency key whose freed slot no wake-up hub gave out (lifecycle/concurrency).
        concurrency.settle_held_keys()
        # A rate limit key whose window opened with no wake-up hub to give its permits out.
        ratelimits.settle_held_keys()
    result.duration_seconds = time.monotonic() - started
    idle = not dry_run and not (result.requeued or result.expired)
    if record and idle and idle_run_id is not None:
        extended = ReaperRun.objects.filter(id=idle_run_id, requeued=0, expired=0).update(
            sweeps=F("sweeps") + 1,
            finished_at=Now(),
            duration_seconds=result.duration_seconds,
            batches=F("batches") + result.batches,
        )
        if extended:
            result.run_id = idle_run_id
            record = False
    if record:
        run = ReaperRun.objects.create(
            finished_at=Now(),
            duration_seconds=result.duration_seconds,
            batches=result.batches,
            requeued=0 if dry_run else result.requeued,
            expired=0 if dry_run else result.expired,
            dry_run=dry_run,
            host=socket.gethostname()[:255],
            pid=os.getpid(),
        )
        result.run_id = run.id
    if result.requeued or result.expired:
        log.info(
            "reaper %s: requeued=%d expired=%d batches=%d in %.3fs",
            "would reap" if dry_run else "reaped",
            result.requeued,
            result.expired,
            result.batches,
            result.duration_seconds,
        )
    return result


def interval_seconds() -> float:
    return float(jobqueue_settings()["REAPER_INTERVAL_SECONDS"])


def counts(result: SweepResult) -> dict:
    return {"requeued": result.requeued, "expired": result.expired, "batches": result.batches}


def run_once(**options) -> SweepResult:
    """One sweep with reap_claims' options (batch_size, max_batches, dry_run, ...); its
    counts are counts(result)."""
    return sweep(**options)


def service_run(*, idle_run_id: int | None = None) -> tuple[dict, int | None, bool]:
    """One sweep as the maintenance loop calls it: (counts, its reaper_run row, idle)."""
    return Sweeps().service_run(idle_run_id=idle_run_id)


@dataclass
class Sweeps:
    """The reaper as a service of the loop with reap_claims' options; `last` is the latest
    sweep's whole result (reap_claims --loop prints it)."""

    batch_size: int | None = None
    max_batches: int | None = None
    last: SweepResult | None = None

    SERVICE = SERVICE

    @staticmethod
    def interval_seconds() -> float:
        return interval_seconds()

    def service_run(self, *, idle_run_id: int | None = None) -> tuple[dict, int | None, bool]:
        self.last = result = sweep(batch_size=self.batch_size, max_batches=self.max_batches,
                                   idle_run_id=idle_run_id)
        return counts(result), result.run_id, not (result.requeued or result.expired)
