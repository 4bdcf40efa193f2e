"""The effect ledger from a job's child process (docs/effects.md, "From the job's command"):
`jobqueue-effect begin KEY` / `jobqueue-effect commit KEY --result JSON`, or, from Python,
`begin(key)`, `commit(key, result)` and `run(key, fn)`, which answer as AgentClient's methods
do (an Effect, or the ApiError subclass of the code).

The child never holds the agent's token: it asks its agent, which serves the job's ledger on
a Unix socket named by JOB_EFFECT_SOCKET and calls the service with the job's current claim
(effect_server.py, the agent's side).

The protocol (one request per connection, each way one JSON object and a newline):

    child -> agent   {"op": "begin", "key": "charge-card"}
                     {"op": "commit", "key": "charge-card", "result": <any JSON>}
    agent -> child   the service's answer: {"state", "effect_id", "attempt", "result"?}
                     or {"error": {"status": 409, "code": "claim_superseded", "detail": "…"}}

`jobqueue-effect` prints the answer as one JSON line (or one field of it with --print).
Its exit statuses are `jobqueue`'s (cli_output.py, docs/cli.md): 0 the ledger answered
(begin: any state; commit: committed), 2 bad usage or a request refused as invalid (by the
service, or here: over REQUEST_MAX_BYTES 413, NaN / Infinity), 5 no answer (no
JOB_EFFECT_SOCKET: not run by an agent that serves the ledger; or the agent or the service
could not be reached, or the agent failed, 500 agent_error: the same command again is safe),
6 a 409 (the claim is gone: stop; effect_already_committed; effect_not_begun), 3 / 4 a 404 /
401-403; the error on stderr (`jobqueue-effect: 409 claim_superseded: …`).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from typing import Any

from .cli_output import EXIT_CONFLICT, EXIT_OK, exit_code_of
from .client import (
    ApiError,
    Effect,
    InvalidRequest,
    LeaseLost,
    TransportError,
    check_effect_key,
    error_class,
)
from .effect_server import (
    ENV,
    REQUEST_MAX_BYTES,
    RETRY_SECONDS,
    SUN_PATH_MAX,
    no_json_constant,
    read_line,
)
from .effect_server import EffectServer as EffectServer  # the runner's name for it, kept

# How long the child waits for the agent's answer (the agent retries the service meanwhile).
CHILD_TIMEOUT_SECONDS = RETRY_SECONDS + 30.0


class NoLedger(ApiError):
    """No JOB_EFFECT_SOCKET: this process was not started by an agent that serves the
    ledger."""

    def __init__(self):
        super().__init__(0, "no_ledger", f"{ENV} is not set: not run by an agent that "
                         "serves the effect ledger")


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
        line = json.dumps(request, allow_nan=False).encode()
    except (ValueError, TypeError, RecursionError) as exc:
        raise InvalidRequest(400, "invalid_request", f"the result is not JSON: {exc}") from None
    if len(line) > REQUEST_MAX_BYTES:
        raise InvalidRequest(413, "payload_too_large", f"the request is larger than "
                             f"{REQUEST_MAX_BYTES} bytes (the result is too large)")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            _connect(sock, path)
            sock.sendall(line + b"\n")
            sock.shutdown(socket.SHUT_WR)
            raw = read_line(sock, REQUEST_MAX_BYTES + 4096)
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
    # Too long for sun_path: through the directory's descriptor (Linux), as the agent binds;
    # never by changing the working directory, which is the whole process's.
    dir_fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        sock.connect(f"/proc/self/fd/{dir_fd}/{os.path.basename(path)}")
    finally:
        os.close(dir_fd)


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
        return json.loads(text, parse_constant=no_json_constant)
    except OSError as exc:
        parser.error(f"--result-file: {exc.strerror or exc}")
    except (ValueError, RecursionError):
        parser.error("the result is not valid JSON (NaN and Infinity are not JSON)")
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
