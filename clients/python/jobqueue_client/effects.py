"""The effect ledger for a job's child process (docs/effects.md, "From the job's command"):
`jobqueue-effect begin KEY` / `jobqueue-effect commit KEY --result JSON`.

The child is any command and holds neither the agent's token nor the claim_id. The reference
agent serves each job's ledger on a Unix socket in the job's private directory (0700: only
this user reaches it), named by JOB_EFFECT_SOCKET; the agent makes the service call with the
job's current claim, so a stale attempt is refused by the service, and a refusal that says the
claim is gone stops the child as a heartbeat's would.

The protocol (one request per connection, each way one JSON object and a newline):

    child -> agent   {"op": "begin", "key": "charge-card"}
                     {"op": "commit", "key": "charge-card", "result": <any JSON>}
    agent -> child   the service's answer: {"state", "effect_id", "attempt", "result"?}
                     or {"error": {"status": 409, "code": "claim_superseded", "detail": "…"}}

`jobqueue-effect` prints the answer as one JSON line (or one field of it with --print).
Its exit statuses are `jobqueue`'s (cli_output.py, docs/cli.md): 0 the ledger answered
(begin: any state; commit: committed), 2 bad usage or a request the service refused as
invalid, 5 no answer (no JOB_EFFECT_SOCKET: not run by an agent that serves the ledger; or the
agent or the service could not be reached: the same command again is safe), 6 a 409 (the
claim is gone: stop; effect_already_committed; effect_not_begun), 3 / 4 a 404 / 401-403; the
error on stderr (`jobqueue-effect: 409 claim_superseded: …`).

A Python child can call `begin(key)`, `commit(key, result)` and `run(key, fn)` here instead,
which answer as AgentClient's methods do (an Effect, or the ApiError subclass of the code).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import selectors
import shutil
import socket
import sys
import sysconfig
import threading
import time
from typing import Any

from .cli_output import EXIT_CONFLICT, EXIT_OK, exit_code_of
from .client import (
    AgentClient,
    ApiError,
    Effect,
    InvalidRequest,
    LeaseLost,
    NotFound,
    TransportError,
    check_effect_key,
    error_class,
)

ENV = "JOB_EFFECT_SOCKET"
COMMAND = "jobqueue-effect"
SOCKET_NAME = "effects.sock"
# A request carries at most a result (the server's JOBQUEUE_MAX_RESULT_BYTES, 1 MiB by
# default, says the rest); more than this is refused without asking.
REQUEST_MAX_BYTES = 4 * 1024 * 1024
# How long the agent keeps retrying a service call that got no answer (within the lease),
# and how long the child waits for the agent's answer.
RETRY_SECONDS = 60.0
CHILD_TIMEOUT_SECONDS = RETRY_SECONDS + 30.0
READ_TIMEOUT_SECONDS = 10.0  # for the child's request to arrive once it connected
MAX_CONNECTIONS = 8  # served at once per job; more wait in the socket's backlog
# sun_path holds 108 bytes on Linux, 104 on the BSDs and macOS.
SUN_PATH_MAX = 100

log = logging.getLogger("jobqueue.agent")


class NoLedger(ApiError):
    """No JOB_EFFECT_SOCKET: this process was not started by an agent that serves the
    ledger."""

    def __init__(self):
        super().__init__(0, "no_ledger", f"{ENV} is not set: not run by an agent that "
                         "serves the effect ledger")


# --- the agent's side ----------------------------------------------------------------------


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

    def open(self, jobdir, child_path: str | None = None) -> dict[str, str]:
        """Listen in `jobdir` (a workdir.JobDir); returns the child's variables
        ({JOB_EFFECT_SOCKET: path}, and PATH when `child_path`, the child's PATH, does not
        lead to jobqueue-effect: see command_path), or {} when no socket could be made
        (logged)."""
        path = jobdir.file(SOCKET_NAME)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # A long TMPDIR: bind through the directory's descriptor (Linux), the child
            # connects from within the directory (_connect).
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
        self._wake = os.pipe()
        self._thread = threading.Thread(target=self._serve, daemon=True,
                                        name=f"effects-{self.lease.job_id}")
        self._thread.start()
        variables = {ENV: path}
        if child_path is not None and (extended := command_path(child_path)) != child_path:
            variables["PATH"] = extended
        return variables

    def close(self) -> None:
        """Stop serving (at once: the serving thread waits on the socket and a wake-up pipe,
        never on a timer, so the job's end is not held up)."""
        self._stop.set()
        if self._thread is not None:
            os.write(self._wake[1], b"x")
            self._thread.join(timeout=5)
            for fd in self._wake:
                os.close(fd)
            self._thread = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _serve(self) -> None:
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
                except OSError:
                    return
                self._slots.acquire()
                threading.Thread(target=self._handle, args=(conn,), daemon=True,
                                 name=f"effect-{self.lease.job_id}").start()

    def _handle(self, conn: socket.socket) -> None:
        try:
            with conn:
                conn.settimeout(READ_TIMEOUT_SECONDS)
                try:
                    raw = _read_line(conn, REQUEST_MAX_BYTES)
                except (OSError, ValueError) as exc:
                    answer = _error(400, "invalid_request", str(exc))
                else:
                    answer = self.answer(raw)
                conn.settimeout(READ_TIMEOUT_SECONDS)
                try:
                    conn.sendall(json.dumps(answer).encode() + b"\n")
                except OSError:
                    pass  # the child went away; a begin or commit may be asked again
        except Exception:  # noqa: BLE001 - a bug here must not take the agent down
            log.exception("event=effect_error job=%s", self.lease.job_id)
        finally:
            self._slots.release()

    def answer(self, raw: bytes) -> dict:
        """The answer to one request line (the service's, or an error object)."""
        try:
            request = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError):
            return _error(400, "invalid_request", "the request is not one JSON object")
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
            except (LeaseLost, NotFound) as exc:
                if lease.mark_lost(exc.code):
                    log.warning("event=lease_lost job=%s attempt=%s code=%s via=effect",
                                lease.job_id, lease.attempt, exc.code)
                return _error(exc.status, exc.code, exc.detail)
            except ApiError as exc:
                if exc.transient and time.monotonic() < give_up and not lease.lost:
                    time.sleep(max(0.0, min(delay, give_up - time.monotonic())))
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
    Appended, so nothing the job's PATH names is shadowed."""
    scripts = sysconfig.get_path("scripts")
    if (not scripts or not os.path.exists(os.path.join(scripts, COMMAND))
            or shutil.which(COMMAND, path=path) is not None):
        return path
    return f"{path}{os.pathsep}{scripts}" if path else scripts


def _error(status: int, code: str, detail: str) -> dict:
    return {"error": {"status": status, "code": code, "detail": detail}}


def _read_line(conn: socket.socket, limit: int) -> bytes:
    """One line (without its newline; EOF ends it too), at most `limit` bytes."""
    data = bytearray()
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            return bytes(data)
        end = chunk.find(b"\n")
        data += chunk if end < 0 else chunk[:end]
        if len(data) > limit:
            raise ValueError(f"the request is larger than {limit} bytes")
        if end >= 0:
            return bytes(data)


# --- the child's side ----------------------------------------------------------------------


def ask(request: dict, *, path: str | None = None,
        timeout: float = CHILD_TIMEOUT_SECONDS) -> dict:
    """Send one request to the agent; the service's answer, or its error raised as the
    ApiError subclass of its code (NoLedger without JOB_EFFECT_SOCKET; TransportError when
    the agent cannot be reached or does not answer: asking again is safe)."""
    path = path or os.environ.get(ENV)
    if not path:
        raise NoLedger()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            _connect(sock, path)
            sock.sendall(json.dumps(request).encode() + b"\n")
            sock.shutdown(socket.SHUT_WR)
            raw = _read_line(sock, REQUEST_MAX_BYTES + 4096)
    except (OSError, ValueError) as exc:
        raise TransportError(f"the agent's effect ledger at {path}: "
                             f"{type(exc).__name__}: {exc}") from None
    try:
        answer = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        raise TransportError("the agent's answer is not JSON") from None
    if not isinstance(answer, dict):
        raise TransportError("the agent's answer is not a JSON object")
    error = answer.get("error")
    if isinstance(error, dict):
        status, code = int(error.get("status") or 0), str(error.get("code") or "error")
        detail = str(error.get("detail") or "")
        if status == 0:
            raise TransportError(detail)
        raise error_class(status, code)(status, code, detail)
    return answer


def _connect(sock: socket.socket, path: str) -> None:
    if len(os.fsencode(path)) <= SUN_PATH_MAX:
        sock.connect(path)
        return
    # Too long for sun_path: connect from within its directory (this is a short-lived,
    # single-threaded caller: changing its directory for the call harms nobody).
    here = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.chdir(os.path.dirname(path))
        sock.connect(os.path.basename(path))
    finally:
        os.fchdir(here)
        os.close(here)


def begin(key: str, **kwargs) -> Effect:
    """Begin the effect `key` through the agent: an Effect (state, effect_id, attempt,
    result; commit(result) records the outcome), as AgentClient.begin_effect answers."""
    check_effect_key(key)
    return Effect(key, ask({"op": "begin", "key": key}, **kwargs),
                  lambda result: ask({"op": "commit", "key": key, "result": result}, **kwargs))


def commit(key: str, result: Any, **kwargs) -> Effect:
    """Record `result` as the outcome of the effect `key` this attempt began."""
    check_effect_key(key)
    return Effect(key, ask({"op": "commit", "key": key, "result": result}, **kwargs))


def run(key: str, fn, **kwargs) -> Any:
    """As AgentClient.run_effect: the recorded result when committed (fn not called), else
    fn(effect)'s return, committed."""
    fx = begin(key, **kwargs)
    return fx.result if fx.committed else fx.commit(fn(fx))


# --- jobqueue-effect -------------------------------------------------------------------------

FIELDS = ("state", "effect_id", "attempt", "result")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jobqueue-effect",
        description="The effect ledger of the job this command runs in, through its agent "
        "(docs/effects.md). Prints the answer as one JSON line.",
        epilog="exit status: 0 answered (begin: any state), 2 bad usage (or a request the "
        "service refused as invalid), 3 not found, 4 refused credential, 5 no answer (no "
        "JOB_EFFECT_SOCKET, or the agent or the service unreachable: safe to ask again), "
        "6 conflict (409: the claim is gone, so stop; or effect_already_committed, "
        "effect_not_begun).")
    sub = parser.add_subparsers(dest="op", required=True)
    for op, text in (("begin", "begin the effect, or learn what an earlier attempt did"),
                     ("commit", "record the outcome of the effect this attempt began")):
        one = sub.add_parser(op, help=text, description=text)
        one.add_argument("key", help="1 to 200 of A-Z a-z 0-9 . _ : -, stable across attempts")
        if op == "commit":
            given = one.add_mutually_exclusive_group(required=True)
            given.add_argument("--result", metavar="JSON", help="the outcome, as JSON")
            given.add_argument("--result-file", metavar="PATH",
                               help="read the outcome (JSON) from PATH (- for stdin)")
        one.add_argument("--print", dest="field", choices=FIELDS,
                         help="print only this field (result as JSON, the others as text)")
    return parser


def _result_arg(args, parser) -> Any:
    try:
        if args.result is not None:
            text = args.result
        elif args.result_file == "-":
            text = sys.stdin.read()
        else:
            with open(args.result_file, encoding="utf-8") as fh:
                text = fh.read()
        return json.loads(text)
    except OSError as exc:
        parser.error(f"--result-file: {exc.strerror or exc}")
    except (ValueError, RecursionError):
        parser.error("the result is not valid JSON")
    raise AssertionError("unreachable")  # pragma: no cover


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        check_effect_key(args.key)
    except InvalidRequest as exc:
        parser.error(exc.detail)
    request: dict[str, Any] = {"op": args.op, "key": args.key}
    if args.op == "commit":
        request["result"] = _result_arg(args, parser)
    try:
        answer = ask(request)
    except ApiError as exc:
        print(f"jobqueue-effect: {exc}", file=sys.stderr)
        return EXIT_CONFLICT if isinstance(exc, LeaseLost) else exit_code_of(exc)
    if args.field is None:
        print(json.dumps(answer, separators=(",", ":")))
    elif args.field == "result":
        print(json.dumps(answer.get("result"), separators=(",", ":")))
    else:
        print(answer.get(args.field, ""))
    return EXIT_OK


if __name__ == "__main__":  # python -m jobqueue_client.effects
    sys.exit(main())
