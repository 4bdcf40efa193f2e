"""The reaper: returns jobs whose lease (or max_runtime_seconds) ran out to the queue, or
ends them as `expired`; ends jobs past their expires_at (docs/clocks.md).

One sweep runs bounded batches until nothing is left or `max_batches` is reached; each
sweep is recorded as a ReaperRun so that operators can see when the reaper last ran.
Several reapers may run at once: batches take job rows with SKIP LOCKED.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.db import close_old_connections
from django.db.models import F
from django.db.models.functions import Now

from . import lifecycle
from .actors import REAPER
from .conf import jobqueue_settings
from .models import ReaperRun

log = logging.getLogger("jobqueue.reaper")


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


def run_forever(*, interval: float, batch_size: int | None, max_batches: int | None,
                stop: threading.Event, on_result=None, on_error=None) -> None:
    """Sweep every `interval` seconds until `stop` is set; a set `stop` ends the pause
    between sweeps at once (Event.wait, no polling).

    A database outage does not end the loop: the error is logged, the connection is
    dropped, and the next sweep tries again after a backoff.
    """
    backoff = interval
    idle_run_id = None
    while not stop.is_set():
        close_old_connections()
        try:
            result = sweep(batch_size=batch_size, max_batches=max_batches,
                           idle_run_id=idle_run_id)
        except Exception as exc:  # noqa: BLE001 - the loop must outlive any one failure
            log.warning("reaper sweep failed (%s: %s); retrying", type(exc).__name__, exc)
            if on_error:
                on_error(exc)
            _drop_connection()
            backoff = min(max(backoff * 2, interval), 60.0)
            stop.wait(backoff)
            continue
        backoff = interval
        idle_run_id = result.run_id if not (result.requeued or result.expired) else None
        if on_result:
            on_result(result)
        stop.wait(interval)


def _drop_connection():
    from django.db import connection

    try:
        connection.close()
    # It is already broken: close() raises only when the driver's close() does, which
    # psycopg's and sqlite3's do not for a broken connection.
    except Exception:  # noqa: BLE001  # pragma: no cover -- a guard (above)
        connection.connection = None
