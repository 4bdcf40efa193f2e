"""Leases: `Lease`, what the agent knows about one claim's lease (its deadline on this
machine's clock, whether it is lost, the checkpoint the child saved), shared by the job's
thread and the heartbeat thread; `Heartbeater`, the one thread that renews every lease the
agent holds when it falls due (one batch heartbeat for all that are due, when the server has
it; one heartbeat each otherwise) and marks a lease lost when the server says the claim is
gone."""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .agentlog import log, log_event
from .backoff import Backoff
from .child import CHECKPOINT_MAX_BYTES, CHECKPOINT_OUT_FILE
from .client import AgentClient, Claim
from .errors import ApiError, InvalidRequest, LeaseLost, NotFound, Unsupported
from .workdir import ChildFileError, JobDir

# The server's default bound on one batch heartbeat (JOBQUEUE_MAX_HEARTBEAT_BATCH).
MAX_HEARTBEAT_BATCH = 500


class Lease:
    """What the agent knows about one claim's lease, shared by the job and heartbeat threads.

    `deadline` is on this machine's monotonic clock: the time of the request plus the lease
    the server granted by its own clock, so clock skew between machines does not matter.
    """

    def __init__(self, claim: Claim, sent_at: float):
        self.job_id = claim.job_id
        self.claim_id = claim.claim_id
        self.attempt = claim.attempt
        self.lease_seconds = claim.lease_seconds
        self.interval = max(0.2, min(float(claim.heartbeat_interval_seconds),
                                     claim.lease_seconds / 2))
        self.deadline = sent_at + claim.lease_remaining
        self.next_due = time.monotonic() + self.interval
        self.backoff = Backoff(base=min(0.2, self.interval), cap=self.interval)
        self.lost_code = ""
        self.finished = False  # the report or release was accepted: answers no longer matter
        # Held while a request carrying this claim is in flight, so that a heartbeat never
        # crosses the claim's own report or release (which would be refused as stale).
        self.wire = threading.Lock()
        self.stop_child = threading.Event()  # set: lease lost or drain; the child must stop
        self.lock = threading.Lock()
        self.jobdir: JobDir | None = None  # while the child runs: where it saves checkpoints
        self._checkpoint_sent: bytes | None = None

    def watch(self, jobdir: JobDir | None) -> None:
        with self.lock:
            self.jobdir = jobdir

    def new_checkpoint(self) -> tuple[Any, bytes] | None:
        """(checkpoint, its bytes) when the child saved one not sent yet; None otherwise
        (none, unchanged, or unreadable: a half-written or oversized file is skipped)."""
        with self.lock:
            jobdir = self.jobdir
            if jobdir is None:
                return None
            try:
                raw = jobdir.read(CHECKPOINT_OUT_FILE, CHECKPOINT_MAX_BYTES)
            except (ChildFileError, OSError):
                return None
            if raw is None or raw == self._checkpoint_sent:
                return None
        try:
            value = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError):
            return None
        return (value, raw) if value is not None else None

    def checkpoint_sent(self, raw: bytes) -> None:
        with self.lock:
            self._checkpoint_sent = raw

    @property
    def lost(self) -> bool:
        return bool(self.lost_code)

    def renewed(self, sent_at: float, remaining: float) -> None:
        with self.lock:
            self.deadline = max(self.deadline, sent_at + remaining)
            # Paced from when the heartbeat was sent, so that a slow answer does not stretch
            # the gap between two renewals.
            self.next_due = sent_at + self.interval
            self.backoff.reset()

    def retry_soon(self) -> float:
        """Schedule the next try of a failed heartbeat: after the backoff, but a last one
        just before the local deadline rather than after it."""
        with self.lock:
            now = time.monotonic()
            delay = self.backoff.next()
            left = self.deadline - now
            if left > 0.5:
                delay = min(delay, max(0.25, left - 0.25))
            self.next_due = now + delay
            return delay

    def mark_lost(self, code: str) -> bool:
        """Record that the claim is gone; returns True the first time."""
        with self.lock:
            first = not self.lost_code
            self.lost_code = self.lost_code or code
        self.stop_child.set()
        return first


class Heartbeater(threading.Thread):
    """Renews every registered lease when it is due. Batch path (one request for all due
    leases) when enabled and supported, single path otherwise."""

    def __init__(self, client: AgentClient, *, use_batch: bool, workers: int = 1):
        super().__init__(name="heartbeat", daemon=True)
        self.client = client
        self.use_batch = use_batch
        self._leases: dict[str, Lease] = {}
        self._cond = threading.Condition()
        self._stopping = False
        self._pool = ThreadPoolExecutor(max_workers=workers) if workers > 1 else None

    def add(self, lease: Lease) -> None:
        with self._cond:
            self._leases[lease.job_id] = lease
            self._cond.notify()

    def remove(self, lease: Lease) -> None:
        with self._cond:
            if self._leases.get(lease.job_id) is lease:  # pragma: no branch -- race: re-added
                del self._leases[lease.job_id]

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()

    def run(self) -> None:
        while True:
            with self._cond:
                while not self._stopping:
                    now = time.monotonic()
                    due = [le for le in self._leases.values()
                           if le.next_due <= now and not le.lost and not le.finished]
                    if due:
                        break
                    pending = [le.next_due for le in self._leases.values()
                               if not le.lost and not le.finished]
                    self._cond.wait(timeout=max(0.01, min(pending) - now) if pending else 1.0)
                if self._stopping:
                    break
            try:
                self._beat(due)
            # The heartbeat thread must survive anything (a guard against bugs: _beat_one
            # handles every API error per lease).
            except Exception:  # noqa: BLE001  # pragma: no cover -- a bug guard (above)
                log.exception("event=heartbeat_thread_error")
                time.sleep(0.2)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _beat(self, due: list[Lease]) -> None:
        ready = []
        for lease in due:
            if not lease.wire.acquire(blocking=False):
                lease.next_due = time.monotonic() + 0.05  # its report is in flight
            elif lease.finished:  # pragma: no cover -- race: reported since it fell due
                lease.wire.release()
            else:
                ready.append(lease)
        try:
            for start in range(0, len(ready), MAX_HEARTBEAT_BATCH):
                self._beat_chunk(ready[start:start + MAX_HEARTBEAT_BATCH])
        finally:
            for lease in ready:
                lease.wire.release()

    def _beat_chunk(self, due: list[Lease]) -> None:
        # A lease with a new checkpoint is renewed by the single heartbeat, which carries it.
        saving = {id(le): cp for le in due if (cp := le.new_checkpoint()) is not None}
        for lease in [le for le in due if id(le) in saving]:
            self._beat_one(lease, saving[id(lease)])
        due = [le for le in due if id(le) not in saving]
        if not due:
            return
        if self.use_batch:
            sent_at = time.monotonic()
            try:
                renewals = self.client.heartbeat_batch(
                    [(le.job_id, le.claim_id) for le in due],
                    timeout=_request_timeout(min(le.interval for le in due)),
                )
            except Unsupported:
                self.use_batch = False
                log_event("batch_heartbeat_unsupported", level=logging.WARNING,
                          fallback="single")
            except ApiError as exc:
                for lease in due:
                    self._transient(lease, exc)
                return
            else:
                by_job = {r.job_id: r for r in renewals}
                for lease in due:
                    renewal = by_job.get(lease.job_id)
                    if renewal is None:  # left out of the answer: asked again soon
                        self._retry_or_lose(lease, "not_in_answer", None)
                    elif renewal.renewed:
                        lease.renewed(sent_at, renewal.lease_remaining)
                    else:
                        self._lost(lease, renewal.code)
                return
        if self._pool is not None and len(due) > 1:
            # Two leases due in the same pass without batch heartbeats: timing decides.
            list(self._pool.map(self._beat_one, due))  # pragma: no cover -- timing (above)
        else:
            for lease in due:
                self._beat_one(lease)

    def _beat_one(self, lease: Lease, checkpoint: tuple[Any, bytes] | None = None) -> None:
        sent_at = time.monotonic()
        try:
            renewal = self.client.heartbeat(
                lease.job_id, lease.claim_id, timeout=_request_timeout(lease.interval),
                checkpoint=None if checkpoint is None else checkpoint[0])
        except LeaseLost as exc:
            self._lost(lease, exc.code)
        except NotFound as exc:
            self._lost(lease, exc.code)
        except InvalidRequest as exc:
            if checkpoint is None:
                self._transient(lease, exc)
                return
            # A checkpoint the server refuses (too large): not sent again, the lease renewed.
            lease.checkpoint_sent(checkpoint[1])
            log_event("checkpoint_refused", level=logging.WARNING, job=lease.job_id,
                      attempt=lease.attempt, code=exc.code)
            self._beat_one(lease)
        except ApiError as exc:
            self._transient(lease, exc)
        else:
            if checkpoint is not None:
                lease.checkpoint_sent(checkpoint[1])
                log_event("checkpoint_saved", job=lease.job_id, attempt=lease.attempt,
                          bytes=len(checkpoint[1]))
            lease.renewed(sent_at, renewal.lease_remaining)

    def _lost(self, lease: Lease, code: str) -> None:
        # A heartbeat that crossed our own accepted report: a race.
        if lease.finished:  # pragma: no cover -- that race
            return
        if lease.mark_lost(code):  # pragma: no branch -- race: lost already
            log_event("lease_lost", level=logging.WARNING, job=lease.job_id,
                      attempt=lease.attempt, code=code, via="heartbeat")

    def _transient(self, lease: Lease, exc: ApiError) -> None:
        if self._retry_or_lose(lease, exc.code, exc.status or None):
            log_event("heartbeat_retry", level=logging.WARNING, job=lease.job_id,
                      attempt=lease.attempt, code=exc.code, status=exc.status or None,
                      url=exc.url, retry_in=max(0.0, lease.next_due - time.monotonic()),
                      lease_left=lease.deadline - time.monotonic())

    @staticmethod
    def _retry_or_lose(lease: Lease, code: str, status: int | None) -> bool:
        """A heartbeat that renewed nothing: try again soon (True), or, past the lease's
        local deadline, lose it (False). No heartbeat got through before the lease ran out
        (the network, the server, or a credential it no longer takes): the reaper may give
        the job to another agent, so it is no longer ours (docs/api.md, "Choosing the
        heartbeat interval", 3): the child is stopped and nothing is published."""
        if lease.deadline - time.monotonic() > 0:
            lease.retry_soon()
            return True
        if not lease.finished and lease.mark_lost("lease_expired"):  # pragma: no branch
            log_event("lease_lost", level=logging.WARNING, job=lease.job_id,
                      attempt=lease.attempt, code="lease_expired", via="local_deadline",
                      last_error=code, status=status)
        return False


def _request_timeout(interval: float) -> float:
    return max(1.0, min(10.0, interval * 2))
