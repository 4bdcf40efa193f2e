"""The job's log: `LogStream` sends what the child writes to the attempt's log on the server
(PATCH jobs/{id}/log), from a thread of its own per job, every LOG_INTERVAL_SECONDS and at the
child's end."""

from __future__ import annotations

import logging
import threading
import time

from .agentlog import log, log_event
from .backoff import Backoff
from .client import AgentClient
from .errors import ApiError, AuthError, InvalidRequest, LeaseLost, LogGap, NotFound

# The job's log (PATCH jobs/{id}/log): what the child writes is sent this often and at its
# end, at most LOG_CHUNK_BYTES a request (under the server's 1 MiB body cap); while the server
# cannot be reached at most LOG_BUFFER_BYTES wait (the oldest are dropped, with a marker).
LOG_INTERVAL_SECONDS = 3.0
LOG_CHUNK_BYTES = 256 * 1024
LOG_BUFFER_BYTES = 8 * 1024 * 1024
LOG_FINAL_FLUSH_SECONDS = 10.0


class LogStream:
    """The child's output, appended to the attempt's log on the server every
    LOG_INTERVAL_SECONDS and at the end (GitLab's trace protocol: each chunk names its start,
    so a chunk resent after a lost answer is accepted unchanged).

    It never holds the job up: a transient failure is retried at the next tick; a refusal
    (the claim is gone for good, the log is at its cap) stops the sending, logged once. While
    the server cannot be reached, at most LOG_BUFFER_BYTES wait; older output is dropped and
    a marker line says how much. `offset` is what the server holds."""

    def __init__(self, client: AgentClient, job_id: str, claim_id: str, attempt: int,
                 interval: float = LOG_INTERVAL_SECONDS):
        self.client, self.job_id, self.claim_id, self.attempt = client, job_id, claim_id, attempt
        self.interval = interval
        self.offset = 0
        self.stopped = ""  # why sending stopped, if it did
        self._pending = bytearray()
        self._dropped = 0
        self._lock = threading.Lock()
        self._send = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"log-{job_id}", daemon=True)
        self._thread.start()

    def feed(self, data: bytes) -> None:
        with self._lock:
            if self.stopped:
                return
            self._pending += data
            over = len(self._pending) - LOG_BUFFER_BYTES
            if over > 0:
                del self._pending[:over]
                self._dropped += over

    def _run(self) -> None:
        while not self._done.wait(self.interval):
            self.flush_once()

    def flush_once(self) -> bool:
        """Send what waits (one chunk). True when nothing is left to send (or sending
        stopped), False after a transient failure."""
        with self._send:
            with self._lock:
                if self.stopped:
                    return True
                if self._dropped:
                    marker = f"\n[jobqueue-agent: {self._dropped} bytes of output dropped]\n"
                    self._pending[0:0] = marker.encode()
                    self._dropped = 0
                data = bytes(self._pending[:LOG_CHUNK_BYTES])
            if not data:
                return True
            try:
                length = self.client.append_log(self.job_id, self.claim_id, data, self.offset)
            except LogGap as exc:
                # The server holds less than we thought: go on from its end.
                if exc.length is None:
                    return self._stop(exc.code)
                self.offset = exc.length
                return False
            except (LeaseLost, InvalidRequest, AuthError, NotFound) as exc:
                return self._stop(exc.code)
            except ApiError as exc:
                log_event("log_retry", level=logging.DEBUG, job=self.job_id, code=exc.code,
                          url=exc.url)
                return False
            except Exception:  # noqa: BLE001 - the log must never take the job down
                log.exception("event=log_error job=%s", self.job_id)
                return self._stop("agent_error")
            sent = max(0, min(len(data), length - self.offset))
            self.offset = length
            with self._lock:
                del self._pending[:sent]
                return not self._pending

    def _stop(self, code: str) -> bool:
        with self._lock:
            self.stopped = code
            self._pending.clear()
        log_event("log_stopped", level=logging.WARNING, job=self.job_id, attempt=self.attempt,
                  code=code, length=self.offset)
        return True

    def close(self, timeout: float = LOG_FINAL_FLUSH_SECONDS) -> None:
        """Stop the ticks, then send what is left (until done or `timeout`)."""
        self._done.set()
        self._thread.join(timeout=timeout)
        deadline = time.monotonic() + timeout
        backoff = Backoff(0.1, 1.0)
        while not self.flush_once():
            if time.monotonic() >= deadline:
                log_event("log_unsent", level=logging.WARNING, job=self.job_id,
                          attempt=self.attempt, length=self.offset)
                return
            time.sleep(min(backoff.next(), max(0.0, deadline - time.monotonic())))
