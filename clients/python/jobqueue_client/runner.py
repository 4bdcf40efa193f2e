"""The agent's engine: `Agent` (claim loop, one thread per job, drain) and `AgentOptions`.

Threads, and the module each one's code lives in:
- the caller's thread runs the claim loop (`Agent.run`, here);
- each claimed job runs in its own thread (`Agent._execute`, here): the child process
  (child.py, its config parsed by jobspec.py), then its artifacts (artifacts.py), then its
  report or release (here);
- the job's log is sent by a thread of its own per job (logstream.py, `LogStream`);
- one heartbeat thread renews every lease the agent holds, at the interval each claim
  suggests (batch path when the agent runs several jobs at once and the server has it, single
  path otherwise) (lease.py, `Lease` and `Heartbeater`);
- with several jobs at once, one reporter thread sends the terminal reports that are waiting
  together in one batch report (reports.py, `ReportBatcher`);
- while a job's child runs, a thread of effect_server.EffectServer serves it its effect ledger.
All of them log through agentlog.log_event and retry with backoff.Backoff.

Guarantees the agent keeps:
- it publishes (reports) only while it believes it holds the claim; once a heartbeat or a report
  says the lease is lost (claim_superseded, lease_expired, job_cancelled, job_finished) it stops
  the child (SIGTERM, then SIGKILL after a grace period) and publishes nothing for that job;
- network errors, 5xx and 429 are retried with jittered backoff while the lease allows;
  heartbeats continue meanwhile; a lease whose heartbeats all failed until it ran out (by
  this machine's monotonic clock, from the server's numbers) is lost: the child is stopped; a
  terminal report is retried after a lost response (the server answers 200 again to an
  identical retry); a report the server refuses as invalid (too large, a result it cannot
  store) is sent once more as a failure without a result, saying why;
- dispatch_context reaches the child only through a 0600 file named by JOB_CONTEXT_FILE, and is
  never logged; the agent's own credentials (JOBQUEUE_* variables) are not passed to children,
  nor the claim_id, and the agent is not dumpable (cli.not_dumpable: a child cannot read its
  /proc/<pid>/environ or memory); a child runs as the agent's user all the same, so a
  --config file the agent can rewrite (token rotation) is readable to it (the README). The
  child reaches the job's effect ledger through the agent (JOB_EFFECT_SOCKET,
  effect_server.py), which calls the service with the current claim;
- what the child leaves in its directory is read only by workdir.read_child_file (no link
  followed, nothing that blocks, regular files only, at most the cap + 1 byte), so no result
  file can wedge the agent or exhaust its memory; job directories of dead agents are removed
  at start and every STALE_DIR_SWEEP_SECONDS (workdir.remove_stale_dirs).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from .agentlog import log, log_event
from .artifacts import ARTIFACT_MAX_BYTES, ARTIFACT_MAX_FILES, upload_artifacts
from .backoff import Backoff
from .child import fit_message, run_child
from .client import AgentClient, Claim
from .effect_server import EffectServer
from .errors import (
    ApiError,
    AuthError,
    InvalidRequest,
    LeaseLost,
    NotFound,
    ServerError,
    TransportError,
    Unsupported,
)
from .jobspec import ConfigError, parse_config
from .lease import Heartbeater, Lease
from .logstream import LOG_INTERVAL_SECONDS, LogStream
from .reports import ReportBatcher
from .version import __version__
from .workdir import base_dir, remove_stale_dirs

TERMINAL_REPORT_CAP_SECONDS = 600.0
# The server's default bound on one batch claim (JOBQUEUE_MAX_CLAIM_BATCH).
MAX_CLAIM_BATCH = 100
# Job directories left by dead agents are removed at start and this often afterwards.
STALE_DIR_SWEEP_SECONDS = 900.0
# How much of a claim answer's round trip may come after the server claimed the job and read
# its clock (claim.server_time): sending the answer back. A held claim (long-poll) claims at
# the end of its wait.
CLAIM_ANSWER_MARGIN = 1.0


def claim_started(sent_at: float, received_at: float) -> float:
    """The monotonic moment a claim's `lease_remaining` counts from: no earlier than it was
    sent (its lease cannot have started before), and for a claim the server held for a
    while (long-poll), CLAIM_ANSWER_MARGIN before its answer arrived: counted from the send,
    a claim that waited W seconds would believe its lease W seconds shorter than it is, and
    the first failed heartbeat past that would abandon a job whose lease is still good."""
    return max(sent_at, received_at - CLAIM_ANSWER_MARGIN)


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
        """Claim now (held up to wait_seconds): each claim with the moment its lease's
        `lease_remaining` is counted from (claim_started)."""
        while self.batch:
            limit = min(free, self._batch_cap)
            sent_at = time.monotonic()
            try:
                claims = self.client.claim_batch(limit, wait_seconds=self.wait_seconds)
                started = claim_started(sent_at, time.monotonic())
                return [(c, started) for c in claims]
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
        return [(claim, claim_started(sent_at, time.monotonic()))] if claim else []

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
                    outcome.artifact_error = upload_artifacts(
                        self.client, lease, jobdir,
                        max_files=self.options.artifact_max_files,
                        max_bytes=self.options.artifact_max_bytes)

            if claim.checkpoint is not None:
                log_event("resuming", job=claim.job_id, attempt=claim.attempt)
            ledger = EffectServer(self.client, lease)  # JOB_EFFECT_SOCKET (effect_server.py)

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

    def _report(self, run: _Run, status: str, *, message: str, result: Any = None,
                retry: bool = False) -> None:
        """Publish the terminal status, retrying transient failures while the lease allows.
        `retry`: a retryable failure (the server queues the job again while attempts
        remain)."""
        claim, lease = run.claim, run.lease
        message = fit_message(message)
        backoff = Backoff(0.2, 5.0)
        started = time.monotonic()
        fallback = False  # the report sent is the agent's own failure, after a refusal
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
                if fallback:  # the agent's own short failure was refused too: a bug
                    log_event("report_invalid", level=logging.ERROR, job=claim.job_id,
                              attempt=claim.attempt, code=exc.code)
                    return
                # e.g. payload_too_large, a result or a message the service cannot store:
                # report the failure without the result, saying why (a retryable failure
                # stays retryable), so that the job does not wait for the reaper.
                log_event("report_invalid", level=logging.WARNING, job=claim.job_id,
                          attempt=claim.attempt, code=exc.code, fallback="failure")
                status, result, fallback = "failure", None, True
                message = fit_message(
                    f"the report was refused ({exc.code}): {exc.detail}"[:1000])
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
