"""The agent's side of the effect ledger for a job's child process (docs/effects.md, "From the
job's command"): `EffectServer` serves one job's ledger on a Unix socket while the child runs.
The child's side (`jobqueue-effect`, `begin` / `commit` / `run`) is effects.py; the protocol
between them is in its docstring.

The child is any command and never holds the agent's token (the claim_id it may read in its
JOB_FENCING_TOKEN writes nothing without that token). The socket is in the job's private
directory (0700: only this user reaches it), named by JOB_EFFECT_SOCKET; the agent makes the
service call with the job's current claim, so a stale attempt is refused by the service, and
a refusal that says the claim is gone (a 409) stops the child as a heartbeat's would.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import random
import selectors
import shutil
import socket
import struct
import sysconfig
import threading
import time

from .client import AgentClient, ApiError, LeaseLost, check_effect_key

ENV = "JOB_EFFECT_SOCKET"
COMMAND = "jobqueue-effect"
SOCKET_NAME = "effects.sock"
# A request carries at most a result (the server's JOBQUEUE_MAX_RESULT_BYTES, 1 MiB by
# default, says the rest); more than this is refused without asking.
REQUEST_MAX_BYTES = 4 * 1024 * 1024
DRAIN_MAX_BYTES = 64 * 1024 * 1024  # read past an oversized request before answering 413
# How long the agent keeps retrying a service call that got no answer (within the lease).
RETRY_SECONDS = 60.0
READ_TIMEOUT_SECONDS = 10.0  # for the child's request to arrive once it connected
MAX_CONNECTIONS = 8  # served at once per job; more wait in the socket's backlog
# accept() failures worth waiting out (descriptors or memory short, a peer gone before it was
# accepted); any other ends serving (logged).
ACCEPT_TRANSIENT_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM,
                                     errno.ECONNABORTED, errno.EPROTO, errno.EPERM})
ACCEPT_BACKOFF_SECONDS = 0.05
HANDLER_GRACE_SECONDS = 1.0  # close() waits this long for requests being answered
SERVE_JOIN_SECONDS = 5.0  # and this long for the serving thread (else it releases the socket)
# sun_path holds 108 bytes on Linux, 104 on the BSDs and macOS.
SUN_PATH_MAX = 100

log = logging.getLogger("jobqueue.agent")


class EffectServer:
    """One job's ledger, served to its child on a Unix socket while the child runs.

    `lease` is the runner's Lease of the claim (job_id, claim_id, attempt, deadline, lost,
    mark_lost): a refusal saying the claim is gone marks it lost, which stops the child."""

    def __init__(self, client: AgentClient, lease):
        self.client = client
        self.lease = lease
        self._sock: socket.socket | None = None
        self._stop = threading.Event()
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._thread: threading.Thread | None = None
        self._wake: tuple[int, int] = (-1, -1)
        self._handlers: set[threading.Thread] = set()
        self._lock = threading.Lock()
        self._served = False  # the serving thread is done
        self._check_peer = False
        self._session: int | None = None  # the child's pid: it leads its own session
        self._admitted = threading.Event()
        self._orphaned = False  # close() gave up waiting for it: it releases the socket

    def open(self, jobdir, child_path: str | None = None, *,
             check_peer: bool = False) -> dict[str, str]:
        """Listen in `jobdir` (a workdir.JobDir); returns the child's variables
        ({JOB_EFFECT_SOCKET: path}, and PATH when `child_path`, the child's PATH, does not
        lead to jobqueue-effect: see command_path), or {} when no socket could be made
        (logged). With `check_peer` (Linux), only processes of the child's session are
        answered: admit(pid) names the child once started (it runs in a new session)."""
        self._check_peer = check_peer and hasattr(socket, "SO_PEERCRED")
        path = jobdir.file(SOCKET_NAME)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # A long TMPDIR: bind through the directory's descriptor (Linux); the child
            # connects likewise (_connect).
            sock.bind(path if len(os.fsencode(path)) <= SUN_PATH_MAX
                      else f"/proc/self/fd/{jobdir.dir_fd}/{SOCKET_NAME}")
            sock.listen(16)
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            log.warning("event=effect_socket_failed job=%s attempt=%s error=%s",
                        self.lease.job_id, self.lease.attempt, type(exc).__name__)
            return {}
        self._sock = sock
        try:
            self._wake = os.pipe()
            thread = threading.Thread(target=self._serve, daemon=True,
                                      name=f"effects-{self.lease.job_id}")
            thread.start()  # RuntimeError: can't start new thread
        except (OSError, RuntimeError) as exc:
            self._release()
            log.warning("event=effect_socket_failed job=%s attempt=%s error=%s",
                        self.lease.job_id, self.lease.attempt, type(exc).__name__)
            return {}
        self._thread = thread  # only a started thread: close() joins it
        variables = {ENV: path}
        if child_path is not None and (extended := command_path(child_path)) != child_path:
            variables["PATH"] = extended
        return variables

    def admit(self, proc) -> None:
        """The child started (a Popen; run_child's on_start): requests are answered only
        from its session (its own, its children's unless they left it)."""
        self._session = proc.pid
        self._admitted.set()

    def _peer_refused(self, conn: socket.socket) -> str:
        """Why this connection's process is not answered ("" when it is): with check_peer,
        it must be in the child's session, so another job of the same user (whose own
        directory is as private to the user) cannot write this job's ledger."""
        if not self._check_peer:
            return ""
        if not self._admitted.wait(READ_TIMEOUT_SECONDS):
            return "the job's process is not known"
        try:
            pid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                      struct.calcsize("3i")))[0]
            session = os.getsid(pid)
        except OSError:
            return "the caller cannot be identified"
        return "" if session == self._session else "not a process of this job"

    def close(self) -> None:
        """Stop serving (at once: the serving thread waits on the socket and a wake-up pipe,
        never on a timer, so the job's end is not held up). A request still being answered
        gives up its retries, and its answer no longer touches the lease (the job has
        ended); it is waited for at most HANDLER_GRACE_SECONDS."""
        self._stop.set()
        # Without a thread there is nothing to release: open() failed (and released what it
        # made) or was never called; or this is a second close().
        if self._thread is not None:
            os.write(self._wake[1], b"x")  # open until the thread is done (_release)
            self._thread.join(timeout=SERVE_JOIN_SECONDS)
            with self._lock:
                done, self._orphaned = self._served, not self._served
            if done:
                self._release()
            self._thread = None
        until = time.monotonic() + HANDLER_GRACE_SECONDS
        with self._lock:
            handlers = list(self._handlers)
        for handler in handlers:
            handler.join(timeout=max(0.0, until - time.monotonic()))

    def _release(self) -> None:
        """Close the socket and the wake-up pipe (once: by open() when it fails, by close()
        once the serving thread is done, else by the thread itself when it ends, never under
        its feet). The pipe is not made yet when os.pipe() is what failed."""
        for fd in self._wake:
            if fd >= 0:
                os.close(fd)
        self._wake = (-1, -1)
        sock, self._sock = self._sock, None
        sock.close()

    def _serve(self) -> None:
        try:
            self._accept_loop()
        finally:
            with self._lock:
                self._served, orphaned = True, self._orphaned
            if orphaned:
                self._release()

    def _accept_loop(self) -> None:
        backoff = ACCEPT_BACKOFF_SECONDS
        with selectors.DefaultSelector() as selector:
            selector.register(self._sock, selectors.EVENT_READ)
            selector.register(self._wake[0], selectors.EVENT_READ)
            while not self._stop.is_set():
                selector.select()
                if self._stop.is_set():
                    return
                try:
                    conn, _ = self._sock.accept()
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError as exc:
                    transient = exc.errno in ACCEPT_TRANSIENT_ERRNOS
                    log.warning("event=effect_accept_error job=%s attempt=%s error=%s retry=%s",
                                self.lease.job_id, self.lease.attempt,
                                errno.errorcode.get(exc.errno or 0, type(exc).__name__),
                                "yes" if transient else "no")
                    if not transient:
                        return
                    self._stop.wait(backoff)  # e.g. out of descriptors: let some close
                    backoff = min(1.0, backoff * 2)
                    continue
                backoff = ACCEPT_BACKOFF_SECONDS
                # All MAX_CONNECTIONS busy: wait for one, but not past close().
                while not self._slots.acquire(timeout=0.1):
                    if self._stop.is_set():
                        conn.close()
                        return
                handler = threading.Thread(target=self._handle, args=(conn,), daemon=True,
                                           name=f"effect-{self.lease.job_id}")
                with self._lock:
                    self._handlers.add(handler)
                handler.start()

    def _handle(self, conn: socket.socket) -> None:
        try:
            with conn:
                conn.settimeout(READ_TIMEOUT_SECONDS)
                if refused := self._peer_refused(conn):
                    log.warning("event=effect_peer_refused job=%s attempt=%s reason=%s",
                                self.lease.job_id, self.lease.attempt, refused.replace(" ", "_"))
                    _drain(conn, REQUEST_MAX_BYTES)
                    with contextlib.suppress(OSError):
                        conn.sendall(json.dumps(_error(403, "forbidden", refused)).encode()
                                     + b"\n")
                    return
                try:
                    raw = read_line(conn, REQUEST_MAX_BYTES)
                except TooLarge as exc:
                    # Read the rest (within a cap) first: closing on unread data would reset
                    # the connection, and the child would hear no answer (exit 5, "safe to
                    # repeat") instead of this one (exit 2).
                    _drain(conn, DRAIN_MAX_BYTES)
                    answer = _error(413, "payload_too_large", str(exc))
                except (OSError, ValueError) as exc:
                    answer = _error(400, "invalid_request", str(exc))
                else:
                    try:
                        answer = self.answer(raw)
                    except Exception as exc:  # noqa: BLE001 - answered, never left unanswered
                        log.exception("event=effect_error job=%s", self.lease.job_id)
                        answer = _error(500, "agent_error",
                                        f"the agent failed to answer: {type(exc).__name__}")
                conn.settimeout(READ_TIMEOUT_SECONDS)
                try:
                    conn.sendall(json.dumps(answer).encode() + b"\n")
                except OSError:
                    pass  # the child went away; a begin or commit may be asked again
        except Exception:  # noqa: BLE001 - a bug here must not take the agent down
            log.exception("event=effect_error job=%s", self.lease.job_id)
        finally:
            with self._lock:
                self._handlers.discard(threading.current_thread())
            self._slots.release()

    def answer(self, raw: bytes) -> dict:
        """The answer to one request line (the service's, or an error object)."""
        try:
            request = json.loads(raw.decode("utf-8"), parse_constant=no_json_constant)
        except (ValueError, RecursionError):
            return _error(400, "invalid_request", "the request is not one JSON object "
                          "(NaN and Infinity are not JSON)")
        op = request.get("op") if isinstance(request, dict) else None
        if op not in ("begin", "commit") or (op == "commit" and "result" not in request):
            return _error(400, "invalid_request",
                          'expected {"op": "begin", "key"} or {"op": "commit", "key", "result"}')
        key = request.get("key")
        lease = self.lease
        give_up = min(time.monotonic() + RETRY_SECONDS, lease.deadline)
        delay = 0.2
        while True:
            try:
                check_effect_key(key)
                if op == "begin":
                    fx = self.client.begin_effect(lease.job_id, lease.claim_id, key)
                else:
                    fx = self.client.commit_effect(lease.job_id, lease.claim_id, key,
                                                   request["result"])
            except LeaseLost as exc:
                # Only a refused claim: a 404 (an older server without the effects route
                # answers not_found too) goes back to the child, the heartbeat decides.
                # Once the job has ended (reported, or this server closed), a late refusal
                # says nothing about a lease that no longer matters (as Heartbeater._lost).
                if (not lease.finished and not self._stop.is_set()
                        and lease.mark_lost(exc.code)):
                    log.warning("event=lease_lost job=%s attempt=%s code=%s via=effect",
                                lease.job_id, lease.attempt, exc.code)
                return _error(exc.status, exc.code, exc.detail)
            except ApiError as exc:
                if (exc.transient and time.monotonic() < give_up and not lease.lost
                        and not self._stop.is_set()):
                    if self._stop.wait(max(0.0, min(delay, give_up - time.monotonic()))):
                        return _error(exc.status, exc.code, exc.detail)  # closed meanwhile
                    delay = min(5.0, delay * 2) * random.uniform(0.75, 1.0)
                    continue
                return _error(exc.status, exc.code, exc.detail)
            log.info("event=effect_%s job=%s attempt=%s key=%s state=%s", op, lease.job_id,
                     lease.attempt, key, fx.state)
            answer = {"state": fx.state, "effect_id": fx.effect_id, "attempt": fx.attempt}
            if fx.committed:
                answer["result"] = fx.result
            return answer


def command_path(path: str) -> str:
    """`path` (a PATH) with this installation's scripts directory appended when it holds
    jobqueue-effect and `path` does not lead to one: the child finds the command by its name
    however the agent was installed (a virtualenv's bin is seldom on a service's PATH).
    Appended, so nothing the job's PATH names is shadowed. An empty PATH (or none) stands for
    the system's default search path (os.defpath), as for exec: the child still finds sh."""
    scripts = sysconfig.get_path("scripts")
    base = path or os.defpath
    if (not scripts or not os.path.exists(os.path.join(scripts, COMMAND))
            or shutil.which(COMMAND, path=base) is not None):
        return path
    return f"{base}{os.pathsep}{scripts}"


def no_json_constant(name: str):
    """json's parse_constant: NaN, Infinity and -Infinity are not JSON (the service, and the
    client's encoder, refuse them)."""
    raise ValueError(f"{name} is not JSON")


def _error(status: int, code: str, detail: str) -> dict:
    return {"error": {"status": status, "code": code, "detail": detail}}


class TooLarge(ValueError):
    pass


def _drain(conn: socket.socket, cap: int) -> None:
    """Read and discard what the peer still sends, up to `cap` bytes or EOF."""
    try:
        while cap > 0 and (chunk := conn.recv(65536)):
            cap -= len(chunk)
    except OSError:
        pass


def read_line(conn: socket.socket, limit: int) -> bytes:
    """One line (without its newline; EOF ends it too), at most `limit` bytes."""
    data = bytearray()
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            return bytes(data)
        end = chunk.find(b"\n")
        data += chunk if end < 0 else chunk[:end]
        if len(data) > limit:
            raise TooLarge(f"the request is larger than {limit} bytes")
        if end >= 0:
            return bytes(data)
