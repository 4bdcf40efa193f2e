"""The agent's engine: claim loop, child processes, heartbeats, reports, drain.

Threads: the caller's thread runs the claim loop (`Agent.run`); each claimed job runs in its
own thread (child process, then report); one heartbeat thread renews every lease the agent
holds, at the interval each claim suggests (batch path when the agent runs several jobs at once
and the server has it, single path otherwise); with several jobs at once, one reporter thread
sends the terminal reports that are waiting together in one batch report (ReportBatcher);
while a job's child runs, a thread of effects.EffectServer serves it the job's effect ledger.

Guarantees the agent keeps:
- it publishes (reports) only while it believes it holds the claim; once a heartbeat or a report
  says the lease is lost (claim_superseded, lease_expired, job_cancelled, job_finished) it stops
  the child (SIGTERM, then SIGKILL after a grace period) and publishes nothing for that job;
- network errors, 5xx and 429 are retried with jittered backoff while the lease allows;
  heartbeats continue meanwhile; a terminal report is retried after a lost response (the server
  answers 200 again to an identical retry);
- dispatch_context reaches the child only through a 0600 file named by JOB_CONTEXT_FILE, and is
  never logged; the agent's own credentials (JOBQUEUE_* variables) are not passed to children,
  nor the claim_id: the child reaches the job's effect ledger through the agent
  (JOB_EFFECT_SOCKET, effects.py), which calls the service with the current claim;
- what the child leaves in its directory is read only by workdir.read_child_file (no link
  followed, nothing that blocks, regular files only, at most the cap + 1 byte), so no result
  file can wedge the agent or exhaust its memory; job directories of dead agents are removed
  at start and every STALE_DIR_SWEEP_SECONDS (workdir.remove_stale_dirs).
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import signal
import subprocess
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .client import (
    AgentClient,
    ApiError,
    AuthError,
    Claim,
    InvalidRequest,
    LeaseLost,
    LogGap,
    NotFound,
    ServerError,
    TransportError,
    Unsupported,
)
from .effects import EffectServer
from .version import __version__
from .workdir import ARTIFACTS_DIR, ChildFileError, JobDir, base_dir, remove_stale_dirs

log = logging.getLogger("jobqueue.agent")

OUTPUT_TAIL_CHARS = 4000
OUTPUT_BUFFER_BYTES = 64 * 1024
RESULT_FILE_MAX_BYTES = 1024 * 1024
# The server's default cap on a report's message (JOBQUEUE_MAX_MESSAGE_BYTES, UTF-8 bytes):
# the agent cuts its summary to fit.
MESSAGE_MAX_BYTES = 64 * 1024
TRUNCATION_MARK = "\n[… truncated …]\n"
CONTEXT_FILE = "context.json"
RESULT_FILE = "result.json"
# The previous attempt's checkpoint (JOB_CHECKPOINT_FILE), and where the child writes a new
# one (JOB_CHECKPOINT_OUT) for the agent to send with its next heartbeat.
CHECKPOINT_FILE = "checkpoint.json"
CHECKPOINT_OUT_FILE = "checkpoint-out.json"
CHECKPOINT_MAX_BYTES = 64 * 1024
TERMINAL_REPORT_CAP_SECONDS = 600.0
# The server's default bound on one batch claim (JOBQUEUE_MAX_CLAIM_BATCH).
MAX_CLAIM_BATCH = 100
# ... and on one batch heartbeat (JOBQUEUE_MAX_HEARTBEAT_BATCH).
MAX_HEARTBEAT_BATCH = 500
# ... and on one batch report (JOBQUEUE_MAX_REPORT_BATCH).
MAX_REPORT_BATCH = 500
# A report bigger than this (its result, mostly) goes alone; a batch stays well under the
# server's default body cap (JOBQUEUE_MAX_REQUEST_BYTES, 1 MiB).
BATCH_REPORT_ITEM_BYTES = 16 * 1024
BATCH_REPORT_BYTES = 512 * 1024
# Job directories left by dead agents are removed at start and this often afterwards.
STALE_DIR_SWEEP_SECONDS = 900.0
# The job's log (PATCH jobs/{id}/log): what the child writes is sent this often and at its
# end, at most LOG_CHUNK_BYTES a request (under the server's 1 MiB body cap); while the server
# cannot be reached at most LOG_BUFFER_BYTES wait (the oldest are dropped, with a marker).
LOG_INTERVAL_SECONDS = 3.0
LOG_CHUNK_BYTES = 256 * 1024
LOG_BUFFER_BYTES = 8 * 1024 * 1024
LOG_FINAL_FLUSH_SECONDS = 10.0
# Artifacts: the files the child leaves in JOB_ARTIFACTS_DIR, uploaded before a successful
# report (the server's defaults: JOBQUEUE_MAX_ARTIFACT_BYTES, ..._ARTIFACTS_PER_ATTEMPT).
ARTIFACT_MAX_BYTES = 100 * 1024 * 1024
ARTIFACT_MAX_FILES = 100
ARTIFACT_NAME = re.compile(r"[A-Za-z0-9._-]{1,200}")


def log_event(event: str, *, level: int = logging.INFO, job: str | None = None,
              attempt: int | None = None, **fields: Any) -> None:
    """One line per event: `event=... job=... attempt=... key=value ...`. Callers pass only
    non-secret values (ids, codes, counts, durations), never contexts, results or tokens."""
    parts = [f"event={event}"]
    if job is not None:
        parts.append(f"job={job}")
    if attempt is not None:
        parts.append(f"attempt={attempt}")
    for key, value in fields.items():
        if value is None:
            continue
        if isinstance(value, float):
            value = f"{value:.3f}"
        text = str(value).replace("\n", " ")
        if " " in text:
            text = json.dumps(text)
        parts.append(f"{key}={text}")
    log.log(level, " ".join(parts))


# --- backoff -----------------------------------------------------------------------------


class Backoff:
    """Exponential backoff with "equal jitter": the n-th delay is uniform in
    [d/2, d] with d = min(cap, base * 2**n), so a fleet does not retry in lockstep."""

    def __init__(self, base: float = 0.2, cap: float = 5.0, rng: random.Random | None = None):
        if base <= 0 or cap < base:
            raise ValueError("need 0 < base <= cap")
        self.base = base
        self.cap = cap
        self.failures = 0
        self._rng = rng or random.Random()

    def next(self) -> float:
        ceiling = min(self.cap, self.base * (2 ** min(self.failures, 30)))
        self.failures += 1
        return ceiling / 2 + self._rng.uniform(0, ceiling / 2)

    def reset(self) -> None:
        self.failures = 0


# --- the job's command ---------------------------------------------------------------------


class ConfigError(ValueError):
    """job_agent_config cannot be run; the job is reported as failure without running."""


@dataclass(frozen=True)
class JobSpec:
    command: list[str]
    env: dict[str, str]
    timeout_seconds: float | None


def parse_config(config: Any) -> JobSpec:
    """Validate `{"command": [str, ...], "env": {str: str}, "timeout_seconds": N}`."""
    if not isinstance(config, dict):
        raise ConfigError("job_agent_config must be an object")
    command = config.get("command")
    if (not isinstance(command, list) or not command
            or not all(isinstance(a, str) for a in command) or not command[0]):
        raise ConfigError("job_agent_config.command must be a non-empty list of strings")
    env = config.get("env") or {}
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and k and "=" not in k and isinstance(v, str) for k, v in env.items()
    ):
        raise ConfigError("job_agent_config.env must map variable names to strings")
    timeout = config.get("timeout_seconds")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0
    ):
        raise ConfigError("job_agent_config.timeout_seconds must be a positive number")
    return JobSpec(command=list(command), env=dict(env),
                   timeout_seconds=float(timeout) if timeout is not None else None)


# The exit status by which a command says its failure is transient (sysexits.h EX_TEMPFAIL):
# the agent reports it with retry: true.
EX_TEMPFAIL = 75


@dataclass
class ChildOutcome:
    returncode: int | None = None
    timed_out: bool = False
    stopped: bool = False  # stopped on request (lease lost, drain)
    start_error: str = ""
    output_tail: str = ""
    result: Any = None
    result_error: str = ""
    artifact_error: str = ""  # why the job's artifacts could not all be uploaded

    @property
    def transient(self) -> bool:
        """A failure worth another attempt: the command said so (exit status 75,
        EX_TEMPFAIL) or ran out of its timeout_seconds."""
        return self.timed_out or (self.returncode == EX_TEMPFAIL and not self.stopped)

    @property
    def succeeded(self) -> bool:
        return (self.returncode == 0 and not self.timed_out and not self.stopped
                and not self.start_error and not self.result_error and not self.artifact_error)

    def message(self) -> str:
        tail = self.output_tail
        if self.start_error:
            head = f"could not start the command: {self.start_error}"
        elif self.timed_out:
            head = "timed out"
        elif self.result_error:
            head = self.result_error
        elif self.artifact_error:
            head = self.artifact_error
        elif self.returncode not in (0, None):
            head = (f"killed by signal {-self.returncode}" if self.returncode < 0
                    else f"exit status {self.returncode}")
        else:
            return tail
        return f"{head}\n{tail}" if tail else head


def fit_message(text: str, limit: int = MESSAGE_MAX_BYTES) -> str:
    """`text` within `limit` UTF-8 bytes: unchanged when it fits, else its start (the first
    line says what happened) and its end (the last output), joined by a mark."""
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return text
    mark = TRUNCATION_MARK.encode()
    if limit <= len(mark):
        return data[:limit].decode("utf-8", "ignore")
    budget = limit - len(mark)
    head = budget // 4
    # errors="ignore" drops a character cut in two at either edge.
    return (data[:head].decode("utf-8", "ignore") + TRUNCATION_MARK
            + data[len(data) - (budget - head):].decode("utf-8", "ignore"))


def child_environment(spec: JobSpec, extra: dict[str, str]) -> dict[str, str]:
    """The agent's environment without its own settings (JOBQUEUE_*: server, token), plus the
    job's env, plus the JOB_* variables (which the job's env cannot override)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBQUEUE_")}
    env.update(spec.env)
    env.update(extra)
    return env


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_process_group(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM the child's process group, then SIGKILL it if still there after `grace`."""
    if proc.poll() is None:
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    _signal_group(proc.pid, signal.SIGKILL)
    proc.wait()


def run_child(spec: JobSpec, *, job_id: str, attempt: int, context: Any,
              stop: threading.Event, kill_grace: float = 5.0,
              on_start=None, on_output=None, on_exit=None, checkpoint: Any = None,
              on_jobdir=None, fencing_token: str | None = None) -> ChildOutcome:
    """Run the job's command to completion, timeout, or until `stop` is set.

    The child runs in its own process group (so that stopping it stops what it started) with
    stdin closed and stdout+stderr merged; the last OUTPUT_TAIL_CHARS of it are kept. The
    dispatch_context is written to a 0600 file in a private 0700 directory (JOB_CONTEXT_FILE;
    see workdir.JobDir); a JSON file the command writes to JOB_RESULT_FILE becomes the result,
    read by the one safe reader (workdir.read_child_file). `on_output(bytes)` gets all the
    output as it comes (the job's log); `on_exit(jobdir, outcome)` runs once the child is
    done. The previous attempt's `checkpoint`, if any, is in JOB_CHECKPOINT_FILE; the child
    may write a new one to JOB_CHECKPOINT_OUT (`on_jobdir(jobdir)` lets the caller watch
    it, and may return more JOB_* variables: JOB_EFFECT_SOCKET). The directory (and
    JOB_ARTIFACTS_DIR in it) is removed afterwards, whatever happened.
    """
    outcome = ChildOutcome()
    jobdir = JobDir()
    try:
        context_path = jobdir.write_private(
            CONTEXT_FILE, json.dumps(context if context is not None else {}).encode())
        extra = {
            "JOB_ID": str(job_id),
            "JOB_ATTEMPT": str(attempt),
            "JOB_CONTEXT_FILE": context_path,
            "JOB_RESULT_FILE": jobdir.file(RESULT_FILE),
            "JOB_ARTIFACTS_DIR": jobdir.file(ARTIFACTS_DIR),
            "JOB_CHECKPOINT_OUT": jobdir.file(CHECKPOINT_OUT_FILE),
        }
        if fencing_token:
            # The claim's signed token, for outside resources that fence (docs/effects.md).
            extra["JOB_FENCING_TOKEN"] = fencing_token
        if checkpoint is not None:
            extra["JOB_CHECKPOINT_FILE"] = jobdir.write_private(
                CHECKPOINT_FILE, json.dumps(checkpoint).encode())
        if on_jobdir is not None:
            extra.update(on_jobdir(jobdir) or {})
        env = child_environment(spec, extra)
        try:
            # The child holds the directory's lock too: an orphan of a killed agent keeps
            # its directory until it ends (workdir.remove_stale_dirs).
            proc = subprocess.Popen(
                spec.command, env=env, cwd=jobdir.path, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                pass_fds=(jobdir.lock_fd,),
            )
        except OSError as exc:
            outcome.start_error = exc.strerror or type(exc).__name__
            outcome.returncode = 127
            return outcome
        if on_start is not None:
            on_start(proc)
        output = _Tail(on_output)
        reader = threading.Thread(target=output.drain, args=(proc.stdout,),
                                  name=f"output-{job_id}", daemon=True)
        reader.start()
        deadline = (time.monotonic() + spec.timeout_seconds) if spec.timeout_seconds else None
        while proc.poll() is None:
            if stop.is_set():
                outcome.stopped = True
                stop_process_group(proc, kill_grace)
                break
            if deadline is not None and time.monotonic() >= deadline:
                outcome.timed_out = True
                stop_process_group(proc, kill_grace)
                break
            wait = 0.05 if deadline is None else max(0.0, min(0.05, deadline - time.monotonic()))
            stop.wait(wait)
        outcome.returncode = proc.wait()
        # The job is over: whatever it left running in its group goes too (and the pipe closes,
        # unless something left the group holding it: then the tail is what came so far).
        _signal_group(proc.pid, signal.SIGKILL)
        reader.join(timeout=5)
        outcome.output_tail = output.text()[-OUTPUT_TAIL_CHARS:]
        outcome.result, outcome.result_error = _read_result(jobdir)
        if on_exit is not None:
            on_exit(jobdir, outcome)
        return outcome
    finally:
        jobdir.close()


class _Tail:
    """The last OUTPUT_BUFFER_BYTES of the child's output, filled by one reader thread and
    read by another (which may not wait for the pipe to close)."""

    def __init__(self, on_output=None):
        self._chunks: deque[bytes] = deque()
        self._size = 0
        self._lock = threading.Lock()
        self._on_output = on_output

    def drain(self, pipe) -> None:
        with pipe:
            while True:
                data = pipe.read1(65536) if hasattr(pipe, "read1") else pipe.read(65536)
                if not data:
                    return
                if self._on_output is not None:
                    self._on_output(data)
                with self._lock:
                    self._chunks.append(data)
                    self._size += len(data)
                    while self._size > OUTPUT_BUFFER_BYTES and len(self._chunks) > 1:
                        self._size -= len(self._chunks.popleft())

    def text(self) -> str:
        with self._lock:
            data = b"".join(self._chunks)
        return data.decode("utf-8", "replace")


def _read_result(jobdir: JobDir) -> tuple[Any, str]:
    """(result, "") from JOB_RESULT_FILE, (None, "") without one, or (None, why not)."""
    try:
        raw = jobdir.read(RESULT_FILE, RESULT_FILE_MAX_BYTES)
    except ChildFileError as exc:
        return None, f"JOB_RESULT_FILE {exc}"
    if raw is None:
        return None, ""
    try:
        return json.loads(raw.decode("utf-8")), ""
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        return None, f"JOB_RESULT_FILE is not valid JSON ({type(exc).__name__})"


# --- the job's log ---------------------------------------------------------------------------


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


# --- leases --------------------------------------------------------------------------------


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
        with self.lock:
            delay = self.backoff.next()
            self.next_due = time.monotonic() + delay
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
                    if renewal is None:
                        lease.retry_soon()
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

    @staticmethod
    def _transient(lease: Lease, exc: ApiError) -> None:
        delay = lease.retry_soon()
        remaining = lease.deadline - time.monotonic()
        log_event("heartbeat_retry", level=logging.WARNING, job=lease.job_id,
                  attempt=lease.attempt, code=exc.code, status=exc.status or None,
                  url=exc.url, retry_in=delay, lease_left=remaining)


class _Single(Exception):  # noqa: N818 - an internal signal, not an error
    """This report must take the single path (alone, no batch report on the server, or the
    batch refused as a whole)."""


@dataclass
class _PendingReport:
    body: dict
    size: int
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


class ReportBatcher(threading.Thread):
    """Group commit for terminal reports, used when the agent runs several jobs at once.

    A job thread hands in its report and waits for the answer. This thread sends the
    reports one request at a time: every report waiting at that moment goes in one request
    (POST job-agents/{id}/reports), those that arrive meanwhile in the next. A lone report
    goes at once through the single path, so nothing waits for company; under load one
    request and one transaction end many jobs. Each report gets the answer the single
    report would have given (accepted, LeaseLost, NotFound, or the request's own error), so
    the job thread's retry rules are unchanged. A server without batch reports (404/405),
    or a batch refused as a whole (400/413), sends its reports through the single path.
    """

    def __init__(self, client: AgentClient):
        super().__init__(name="reporter", daemon=True)
        self.client = client
        self.supported = True
        self._cond = threading.Condition()
        self._queue: deque[_PendingReport] = deque()
        self._stopped = False

    def report(self, job_id: str, claim_id: str, status: str, *, message: str | None = None,
               result: Any = None, retry: bool = False) -> None:
        """Raises what AgentClient.report() raises."""
        body: dict[str, Any] = {"job_id": job_id, "claim_id": claim_id, "status": status}
        if retry:
            body["retry"] = True
        size = 200 + len((message or "").encode("utf-8", "replace"))
        if message is not None:  # pragma: no branch -- always a text (fit_message)
            body["message"] = message
        if result is not None:
            body["result"] = result
            size += len(json.dumps(result))
        if self.supported and size <= BATCH_REPORT_ITEM_BYTES and self.is_alive():
            item = _PendingReport(body, size)
            with self._cond:
                queued = not self._stopped  # run() drains the queue before it returns
                if queued:  # pragma: no branch -- race: stopped since is_alive()
                    self._queue.append(item)
                    self._cond.notify()
            if queued:  # pragma: no branch -- race: stopped since is_alive()
                item.done.wait()
                if item.error is None:
                    return
                if not isinstance(item.error, _Single):
                    raise item.error
        self.client.report(job_id, claim_id, status, message=message, result=result,
                           retry=retry)

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()

    def run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopped:
                    self._cond.wait()
                if not self._queue:
                    return
                batch, total = [self._queue.popleft()], 0
                total = batch[0].size
                while (self._queue and len(batch) < MAX_REPORT_BATCH
                       and total + self._queue[0].size <= BATCH_REPORT_BYTES):
                    batch.append(self._queue.popleft())
                    total += batch[-1].size
            self._send(batch)

    def _send(self, batch: list[_PendingReport]) -> None:
        errors: list[BaseException | None]
        if len(batch) == 1:
            # The body's own fields, not a second list of them (a list dropped `retry` once).
            body = dict(batch[0].body)
            try:
                self.client.report(body.pop("job_id"), body.pop("claim_id"), body.pop("status"),
                                   **body)
                errors = [None]
            except Exception as exc:  # noqa: BLE001 - handed to the job thread, as is
                errors = [exc]
        else:
            try:
                errors = list(self.client.report_batch([item.body for item in batch]))
                log_event("reported_batch", level=logging.DEBUG, reports=len(batch))
            except Unsupported:
                self.supported = False
                log_event("batch_report_unsupported", level=logging.WARNING, fallback="single")
                errors = [_Single()] * len(batch)
            except InvalidRequest as exc:
                log_event("batch_report_refused", level=logging.WARNING, code=exc.code,
                          reports=len(batch), fallback="single")
                errors = [_Single()] * len(batch)
            except ApiError as exc:
                errors = [exc] * len(batch)
            except Exception as exc:  # noqa: BLE001 - a bug must not leave job threads waiting
                log.exception("event=report_batch_error")
                errors = [exc] * len(batch)
        for item, error in zip(batch, errors, strict=True):
            item.error = error
            item.done.set()


def _request_timeout(interval: float) -> float:
    return max(1.0, min(10.0, interval * 2))


# --- the agent ---------------------------------------------------------------------------


@dataclass
class AgentOptions:
    concurrency: int = 1
    drain_timeout: float = 30.0
    kill_grace: float = 5.0
    idle_min: float = 0.2  # first wait when no job is claimable
    idle_max: float = 5.0  # longest wait when no job is claimable
    # Long-poll: ask the server to hold each claim up to this long (0: poll with the idle
    # backoff). A server that answers "nothing" well before it is polled with backoff.
    wait_seconds: int = 0
    release_timeout: float = 10.0  # how long to keep trying to release on shutdown
    log_interval: float = LOG_INTERVAL_SECONDS  # how often the child's output is sent
    artifact_max_bytes: int = ARTIFACT_MAX_BYTES
    artifact_max_files: int = ARTIFACT_MAX_FILES


@dataclass
class _Run:
    claim: Claim
    lease: Lease
    thread: threading.Thread | None = None
    draining: threading.Event = field(default_factory=threading.Event)


class Agent:
    def __init__(self, client: AgentClient, options: AgentOptions | None = None):
        self.client = client
        self.options = options or AgentOptions()
        if self.options.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.batch = self.options.concurrency > 1
        self._batch_cap = MAX_CLAIM_BATCH
        self.heartbeater = Heartbeater(client, use_batch=self.batch,
                                       workers=min(8, self.options.concurrency))
        self.reporter = ReportBatcher(client) if self.batch else None
        self._runs: dict[str, _Run] = {}
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._abort_drain = threading.Event()
        self._next_sweep = 0.0
        self.exit_code = 0
        self.wait_seconds = max(0, int(self.options.wait_seconds))

    # -- control --

    def request_stop(self) -> None:
        """First call: stop claiming and drain. Second call: abort the drain now."""
        if self._stop.is_set():
            self._abort_drain.set()
        self._stop.set()
        with self._cond:
            self._cond.notify_all()

    @property
    def active(self) -> int:
        with self._cond:
            return len(self._runs)

    # -- main loop --

    def run(self) -> int:
        self._sweep_stale_dirs()  # before "started": what a dead agent left is gone by then
        log_event("started", agent=self.client.agent_id, concurrency=self.options.concurrency,
                  version=__version__)
        self.heartbeater.start()
        if self.reporter is not None:
            self.reporter.start()
        idle = Backoff(self.options.idle_min, self.options.idle_max)
        errors = Backoff(0.25, max(5.0, self.options.idle_max))
        while not self._stop.is_set():
            if time.monotonic() >= self._next_sweep:
                self._sweep_stale_dirs()  # pragma: no cover -- every 900 s, after the first
            with self._cond:
                free = self.options.concurrency - len(self._runs)
                if free <= 0:
                    self._cond.wait(timeout=1.0)
                    continue
            asked = time.monotonic()
            try:
                claims = self._claim(free)
            except InvalidRequest as exc:
                if self.wait_seconds and "wait_seconds" in exc.fields:
                    # A server with a lower maximum, or without long-poll: wait less.
                    self.wait_seconds //= 2
                    log_event("claim_wait_refused", level=logging.WARNING,
                              next_wait=self.wait_seconds)
                    continue
                log_event("claim_refused", level=logging.ERROR, code=exc.code,
                          status=exc.status, detail=exc.detail[:200])
                self.exit_code = 1
                self._stop.set()
                break
            except (AuthError, NotFound) as exc:
                log_event("claim_refused", level=logging.ERROR, code=exc.code,
                          status=exc.status, detail=exc.detail[:200])
                self.exit_code = 1
                self._stop.set()
                break
            except ApiError as exc:
                if self._stop.is_set():
                    break  # pragma: no cover -- race: the wait was aborted to stop
                delay = exc.retry_after if exc.retry_after is not None else errors.next()
                log_event("claim_retry", level=logging.WARNING, code=exc.code,
                          status=exc.status or None, url=exc.url, retry_in=delay)
                self._stop.wait(delay)
                continue
            errors.reset()
            if not claims:
                # After a held wait that ran its course, ask again at once; an empty answer
                # that came early (a server without long-poll, or at its cap) backs off.
                if not self.wait_seconds or time.monotonic() - asked < self.wait_seconds / 2:
                    self._stop.wait(idle.next())
                continue
            idle.reset()
            for claim in claims:
                self._start(claim)
        self._drain()
        if self.reporter is not None:
            self.reporter.stop()
            self.reporter.join(timeout=5)
        self.heartbeater.stop()
        self.heartbeater.join(timeout=5)
        log_event("stopped", exit_code=self.exit_code)
        return self.exit_code

    def _sweep_stale_dirs(self) -> None:
        self._next_sweep = time.monotonic() + STALE_DIR_SWEEP_SECONDS
        try:
            removed = remove_stale_dirs()
        # Housekeeping must never stop the agent (a guard: remove_stale_dirs() handles
        # what the file system raises).
        except Exception:  # noqa: BLE001  # pragma: no cover -- a guard (above)
            log.exception("event=stale_dirs_error")
            return
        if removed:
            log_event("stale_dirs_removed", count=removed, where=base_dir())

    def _claim(self, free: int) -> list[tuple[Claim, float]]:
        """Claim up to `free` jobs. A held claim (wait_seconds) runs in a thread of its own
        so that a stop ends it at once: the loop stops waiting for it, abort_wait() closes
        its connection, and whatever it still claims is given straight back."""
        if not self.wait_seconds:
            return self._claim_now(free)
        lock, box, done = threading.Lock(), {}, threading.Event()

        def call():
            try:
                result = self._claim_now(free)
            except Exception as exc:  # noqa: BLE001 - handed to the loop, or dropped
                result, box["error"] = [], exc
            with lock:
                abandoned = box.get("abandoned", False)
                box["claims"] = result
                done.set()
            if abandoned:
                for item in result:  # pragma: no cover -- race: claimed after the stop
                    self._start(item)  # stopping: each is released at once

        threading.Thread(target=call, name="claim-wait", daemon=True).start()
        while not done.wait(0.1):
            if self._stop.is_set():
                with lock:
                    if not done.is_set():  # pragma: no branch -- race: done meanwhile
                        box["abandoned"] = True
                        self.client.abort_wait()
                        return []
        if "error" in box:
            raise box["error"]
        return box["claims"]

    def _claim_now(self, free: int) -> list[tuple[Claim, float]]:
        while self.batch:
            limit = min(free, self._batch_cap)
            sent_at = time.monotonic()
            try:
                return [(c, sent_at) for c in self.client.claim_batch(
                    limit, wait_seconds=self.wait_seconds)]
            except Unsupported:
                self.batch = False
                log_event("batch_claim_unsupported", level=logging.WARNING, fallback="single")
            except InvalidRequest as exc:
                # A server configured with a smaller JOBQUEUE_MAX_CLAIM_BATCH: ask for less.
                if "limit" not in exc.fields:
                    raise
                if limit <= 1:
                    self.batch = False
                else:
                    self._batch_cap = max(1, limit // 2)
                log_event("batch_claim_limit_refused", level=logging.WARNING, limit=limit,
                          next_limit=self._batch_cap if self.batch else None)
        sent_at = time.monotonic()
        claim = self.client.claim_next(wait_seconds=self.wait_seconds)
        return [(claim, sent_at)] if claim else []

    def _start(self, item: tuple[Claim, float]) -> None:
        claim, sent_at = item
        lease = Lease(claim, sent_at)
        run = _Run(claim=claim, lease=lease)
        log_event("claimed", job=claim.job_id, attempt=claim.attempt,
                  lease=claim.lease_seconds, heartbeat_every=lease.interval)
        if self._stop.is_set():
            # Claimed while we were asked to stop: give it straight back.
            self._release(run, "agent stopping")
            return
        with self._cond:
            self._runs[claim.job_id] = run
        self.heartbeater.add(lease)
        run.thread = threading.Thread(target=self._execute, args=(run,),
                                      name=f"job-{claim.job_id}", daemon=True)
        run.thread.start()

    def _finish(self, run: _Run) -> None:
        self.heartbeater.remove(run.lease)
        with self._cond:
            self._runs.pop(run.claim.job_id, None)
            self._cond.notify_all()

    # -- one job --

    def _execute(self, run: _Run) -> None:
        claim, lease = run.claim, run.lease
        try:
            try:
                spec = parse_config(claim.job.get("job_agent_config"))
            except ConfigError as exc:
                log_event("config_invalid", level=logging.WARNING, job=claim.job_id,
                          attempt=claim.attempt)
                self._report(run, "failure", message=str(exc))
                return
            started = time.monotonic()
            log_event("started_child", job=claim.job_id, attempt=claim.attempt,
                      program=os.path.basename(spec.command[0]))
            stream = LogStream(self.client, claim.job_id, claim.claim_id, claim.attempt,
                               interval=self.options.log_interval)

            def on_exit(jobdir, outcome):
                stream.close()  # the last lines, even when the lease is lost (grace period)
                if outcome.succeeded and not lease.lost:
                    outcome.artifact_error = self._upload_artifacts(run, jobdir)

            if claim.checkpoint is not None:
                log_event("resuming", job=claim.job_id, attempt=claim.attempt)
            ledger = EffectServer(self.client, lease)  # JOB_EFFECT_SOCKET (effects.py)

            def on_jobdir(jobdir):
                lease.watch(jobdir)
                return ledger.open(jobdir, spec.env.get("PATH", os.environ.get("PATH", "")),
                                   check_peer=True)

            try:
                outcome = run_child(
                    spec, job_id=claim.job_id, attempt=claim.attempt,
                    context=claim.job.get("dispatch_context"), stop=lease.stop_child,
                    kill_grace=self.options.kill_grace, on_output=stream.feed,
                    on_exit=on_exit, checkpoint=claim.checkpoint, on_jobdir=on_jobdir,
                    on_start=ledger.admit, fencing_token=claim.fencing_token,
                )
            finally:
                stream.close(timeout=0)
                ledger.close()
                lease.watch(None)
            took = time.monotonic() - started
            if lease.lost:
                log_event("abandoned", level=logging.WARNING, job=claim.job_id,
                          attempt=claim.attempt, code=lease.lost_code,
                          child_stopped=outcome.stopped, published="nothing")
                return
            if outcome.stopped and run.draining.is_set():
                log_event("child_stopped_for_shutdown", level=logging.WARNING, job=claim.job_id,
                          attempt=claim.attempt)
                self._release(run, "agent shutting down")
                return
            status = "successful" if outcome.succeeded else "failure"
            retry = status == "failure" and outcome.transient
            log_event("child_exited", job=claim.job_id, attempt=claim.attempt,
                      exit_status=outcome.returncode, timed_out=outcome.timed_out or None,
                      seconds=took, status=status, retry=retry or None)
            self._report(run, status, message=outcome.message(), result=outcome.result,
                         retry=retry)
        except Exception:  # noqa: BLE001 - a bug here must not take the agent down
            log.exception("event=job_thread_error job=%s attempt=%s", claim.job_id, claim.attempt)
        finally:
            self._finish(run)

    def _upload_artifacts(self, run: _Run, jobdir: JobDir) -> str:
        """Upload every file the child left in JOB_ARTIFACTS_DIR (staged for this attempt;
        the successful report publishes them). Returns "" when all went up, else why not
        (the job then reports failure); a lost lease is marked, and nothing is published."""
        claim, lease = run.claim, run.lease
        names = jobdir.artifact_names()
        if len(names) > self.options.artifact_max_files:
            return (f"JOB_ARTIFACTS_DIR holds {len(names)} entries; at most "
                    f"{self.options.artifact_max_files} are uploaded")
        for name in names:
            if not ARTIFACT_NAME.fullmatch(name) or name in (".", ".."):
                return "JOB_ARTIFACTS_DIR: a file name is not 1-200 of A-Z a-z 0-9 . _ -"
            backoff = Backoff(0.2, 5.0)
            while True:
                try:
                    with jobdir.open_artifact(name, self.options.artifact_max_bytes) as fh:
                        info = self.client.upload_artifact(
                            claim.job_id, claim.claim_id, name, fh.chunks(), fh.size,
                            timeout=max(self.client.timeout, 300.0))
                except ChildFileError as exc:
                    return f"artifact {name} {exc}"
                except LeaseLost as exc:
                    lease.mark_lost(exc.code)
                    log_event("upload_refused", level=logging.WARNING, job=claim.job_id,
                              attempt=claim.attempt, code=exc.code, published="nothing")
                    return f"artifact upload refused ({exc.code})"
                except ApiError as exc:
                    if exc.transient and time.monotonic() < lease.deadline and not lease.lost:
                        delay = exc.retry_after if exc.retry_after is not None else backoff.next()
                        log_event("upload_retry", level=logging.WARNING, job=claim.job_id,
                                  attempt=claim.attempt, code=exc.code, url=exc.url,
                                  retry_in=delay)
                        time.sleep(delay)
                        continue
                    return f"artifact {name} was not uploaded ({exc.code})"
                log_event("artifact_uploaded", job=claim.job_id, attempt=claim.attempt,
                          name=name, size=info.get("size"))
                break
        return ""

    def _report(self, run: _Run, status: str, *, message: str, result: Any = None,
                retry: bool = False) -> None:
        """Publish the terminal status, retrying transient failures while the lease allows.
        `retry`: a retryable failure (the server queues the job again while attempts
        remain)."""
        claim, lease = run.claim, run.lease
        message = fit_message(message)
        backoff = Backoff(0.2, 5.0)
        started = time.monotonic()
        while True:
            try:
                with lease.wire:
                    send = self.reporter.report if self.reporter else self.client.report
                    send(claim.job_id, claim.claim_id, status, message=message, result=result,
                         retry=retry)
                    lease.finished = True
            except LeaseLost as exc:
                lease.mark_lost(exc.code)
                log_event("report_refused", level=logging.WARNING, job=claim.job_id,
                          attempt=claim.attempt, code=exc.code, published="nothing")
                return
            except InvalidRequest as exc:
                if result is None and status == "failure":
                    log_event("report_invalid", level=logging.ERROR, job=claim.job_id,
                              attempt=claim.attempt, code=exc.code)
                    return
                # e.g. payload_too_large: report the failure without the result.
                log_event("report_invalid", level=logging.WARNING, job=claim.job_id,
                          attempt=claim.attempt, code=exc.code, fallback="failure")
                status, result = "failure", None
                message = f"the report was refused ({exc.code}): {exc.detail}"[:1000]
                continue
            except ApiError as exc:
                if isinstance(exc, TransportError | ServerError):
                    # The answer is lost: the report may have landed. Ask, read-only.
                    verdict = self._reconcile(run, status)
                    if verdict is not None:
                        return
                now = time.monotonic()
                limit = min(lease.deadline + lease.lease_seconds,
                            started + TERMINAL_REPORT_CAP_SECONDS)
                if isinstance(exc, AuthError | NotFound) or now >= limit:
                    log_event("report_abandoned", level=logging.ERROR, job=claim.job_id,
                              attempt=claim.attempt, code=exc.code, status=exc.status or None,
                              url=exc.url)
                    return
                delay = exc.retry_after if exc.retry_after is not None else backoff.next()
                delay = max(0.0, min(delay, limit - now))
                log_event("report_retry", level=logging.WARNING, job=claim.job_id,
                          attempt=claim.attempt, code=exc.code, status=exc.status or None,
                          url=exc.url, retry_in=delay)
                time.sleep(delay)
                continue
            log_event("reported", job=claim.job_id, attempt=claim.attempt, status=status,
                      has_result=result is not None)
            return

    def _reconcile(self, run: _Run, status: str) -> bool | None:
        """After a report whose answer was lost: True when it landed (the claim ended the
        job with `status`), False when the claim is gone otherwise (publish nothing more),
        None when the claim is still current or the server cannot tell now (send again)."""
        claim, lease = run.claim, run.lease
        try:
            state = self.client.claim_state(claim.job_id, claim.claim_id)
        except ApiError:
            return None
        if state.get("current"):
            return None
        lease.finished = True
        if state.get("final_status") == status:
            log_event("reported", job=claim.job_id, attempt=claim.attempt, status=status,
                      reconciled=True)
            return True
        lease.mark_lost(str(state.get("code") or "claim_superseded"))
        log_event("report_refused", level=logging.WARNING, job=claim.job_id,
                  attempt=claim.attempt, code=state.get("code"), reconciled=True,
                  published="nothing")
        return False

    def _release(self, run: _Run, reason: str) -> None:
        claim = run.claim
        backoff = Backoff(0.2, 2.0)
        give_up = time.monotonic() + self.options.release_timeout
        while True:
            try:
                with run.lease.wire:
                    self.client.release(claim.job_id, claim.claim_id, reason=reason)
                    run.lease.finished = True
            except LeaseLost as exc:
                log_event("release_refused", level=logging.WARNING, job=claim.job_id,
                          attempt=claim.attempt, code=exc.code)
                return
            except ApiError as exc:
                if not exc.transient or time.monotonic() >= give_up:
                    log_event("release_failed", level=logging.ERROR, job=claim.job_id,
                              attempt=claim.attempt, code=exc.code)
                    return
                time.sleep(backoff.next())
                continue
            log_event("released", job=claim.job_id, attempt=claim.attempt, reason=reason)
            return

    # -- shutdown --

    def _drain(self) -> None:
        with self._cond:
            runs = list(self._runs.values())
        if runs:
            log_event("draining", jobs=len(runs), timeout=self.options.drain_timeout)
        deadline = time.monotonic() + self.options.drain_timeout
        with self._cond:
            while self._runs and time.monotonic() < deadline and not self._abort_drain.is_set():
                self._cond.wait(timeout=min(0.2, max(0.0, deadline - time.monotonic())))
            left = list(self._runs.values())
        for run in left:
            run.draining.set()
            run.lease.stop_child.set()
        join_by = time.monotonic() + self.options.kill_grace + self.options.release_timeout + 5
        for run in left:
            if run.thread is not None:  # pragma: no branch -- race: not started yet
                run.thread.join(timeout=max(0.0, join_by - time.monotonic()))
