"""The job's child process: `run_child` runs a JobSpec's command in its own process group,
in a private job directory (workdir.JobDir) holding its context, result, checkpoint and
artifacts, and returns a `ChildOutcome` (exit status, timeout, stop, the output's tail, the
result); `stop_process_group` stops it (SIGTERM, then SIGKILL after a grace period);
`child_environment` is what it gets of the agent's environment; `fit_message` cuts its
summary to the server's cap on a report's message.

The caller's job thread runs `run_child`; one more thread reads the child's output (`_Tail`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from .jobspec import JobSpec
from .workdir import ARTIFACTS_DIR, ChildFileError, JobDir

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
    line says what happened) and its end (the last output), joined by a mark. A NUL (binary
    output), which the service refuses in any string, becomes U+FFFD."""
    text = text.replace("\x00", "\ufffd")
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
                    # Drop the oldest chunk only while the rest still fills the buffer: a
                    # full-size read followed by a short last one must not leave the short
                    # one alone (a tail shorter than OUTPUT_TAIL_CHARS).
                    while (len(self._chunks) > 1
                           and self._size - len(self._chunks[0]) >= OUTPUT_BUFFER_BYTES):
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
