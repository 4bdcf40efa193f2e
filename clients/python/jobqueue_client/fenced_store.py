"""A fenced store: the worked example of an outside resource that fences off stale workers by
itself (docs/effects.md, "Fencing at outside resources"; Kleppmann's fencing tokens).

A worker whose lease ran out (a long GC pause, a stopped VM, a partition) may still believe
it holds its job, while the service has reaped the claim and handed the job to another
worker. The service refuses the stale worker's writes (its claim_id no longer matches), but
an outside resource (a bucket, a database, a payment API) cannot ask the service before each
write. It does not need to: every claim carries a fencing token signed by the service, and
its `attempt` only grows for a job. The store keeps, per job, the highest attempt it has
seen, and refuses a write with a lower one. The key set is fetched once, at start; after
that the store contacts the service only when a token names a key it does not hold (the
service's keys were rotated: `refresh`, at most once every REFRESH_SECONDS).

    store = FencedStore(fetch_jwks("https://jobs.example"), workspace_id="...",
                        refresh=lambda: fetch_jwks("https://jobs.example"))
    store.write(claim.fencing_token, "report.csv", data)   # or raises StaleAttempt

`python -m jobqueue_client.fenced_store --server URL --port 8765` serves one over HTTP
(POST /write {"token", "key", "value"}, at most MAX_BODY_BYTES; GET /read?key=...), for
trying it out and for the acceptance test. Needs the `fencing` extra:
pip install 'jobqueue-client[fencing]'.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from .fencing import FencingClaims, FencingTokenError, fetch_jwks, verify_fencing_token

# A write's body is read whole: more than this is refused (413) without reading it.
MAX_BODY_BYTES = 1024 * 1024
# A token signed by a key the store does not hold fetches the key set again at most this
# often (a forged kid must not make the store hammer the service).
REFRESH_SECONDS = 60.0


class StaleAttempt(Exception):
    """A write with an attempt lower than the highest the store has seen for its job."""

    def __init__(self, claims: FencingClaims, highest: int):
        super().__init__(
            f"refused: job {claims.job_id} attempt {claims.attempt} is stale, the store has "
            f"seen attempt {highest} (a newer claim of the job)"
        )
        self.claims = claims
        self.highest = highest


@dataclass(frozen=True)
class Stored:
    value: Any
    job_id: str
    attempt: int
    claim_id: str


class FencedStore:
    """Values by key, each write fenced by a verified token: a write whose attempt is lower
    than the highest seen for its job is refused (StaleAttempt); an equal or higher one is
    accepted (and a higher one raises the bar). Thread-safe; in memory (a real resource keeps
    `highest` next to its data, in the same transaction as the write).

    `check_expiry` is off by default: a token's `exp` is its lease's end at claim time, and a
    heartbeat extends the lease but not the token, so a long job's later writes would be
    refused; the attempt order fences without any clock."""

    def __init__(self, jwks: dict, *, workspace_id: str | None = None,
                 issuer: str | None = "jobqueue", check_expiry: bool = False,
                 refresh: Callable[[], dict] | None = None):
        self.jwks = jwks
        self.workspace_id = workspace_id
        self.issuer = issuer
        self.check_expiry = check_expiry
        self.refresh = refresh
        self._lock = threading.Lock()
        self._highest: dict[str, int] = {}
        self._data: dict[str, Stored] = {}
        self._refreshed_at: float | None = None

    def verify(self, token: str) -> FencingClaims:
        try:
            return self._verify(token)
        except FencingTokenError as exc:
            # A key the set does not hold: the service may have rotated its keys since the
            # set was fetched. Fetch it again (not more than once every REFRESH_SECONDS),
            # then verify once more; any other refusal stands.
            if exc.reason != "unknown_key" or not self._refreshed():
                raise
        return self._verify(token)

    def _verify(self, token: str) -> FencingClaims:
        return verify_fencing_token(token, self.jwks, workspace_id=self.workspace_id,
                                    issuer=self.issuer, check_expiry=self.check_expiry)

    def _refreshed(self) -> bool:
        """Fetch the key set again if `refresh` is given and it was not fetched within
        REFRESH_SECONDS: whether it was."""
        if self.refresh is None:
            return False
        with self._lock:
            now = time.monotonic()
            if self._refreshed_at is not None and now - self._refreshed_at < REFRESH_SECONDS:
                return False
            self._refreshed_at = now
        jwks = self.refresh()
        with self._lock:
            self.jwks = jwks
        return True

    def write(self, token: str, key: str, value: Any) -> FencingClaims:
        """Store `value` under `key` for the token's claim; raises FencingTokenError (the
        token does not verify) or StaleAttempt (a newer attempt of the job has written)."""
        claims = self.verify(token)
        with self._lock:
            highest = self._highest.get(claims.job_id, 0)
            if claims.attempt < highest:
                raise StaleAttempt(claims, highest)
            self._highest[claims.job_id] = claims.attempt
            self._data[key] = Stored(value, claims.job_id, claims.attempt, claims.claim_id)
        return claims

    def read(self, key: str) -> Stored | None:
        with self._lock:
            return self._data.get(key)

    def highest_attempt(self, job_id: str) -> int:
        with self._lock:
            return self._highest.get(str(job_id), 0)


def _handler(store: FencedStore):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format, *args):  # noqa: A002 - the base class's name
            pass

        def _answer(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self):  # noqa: N802 - http.server's name
            if urlsplit(self.path).path != "/write":
                return self._answer(404, {"code": "not_found"})
            try:
                length = int(self.headers.get("Content-Length", 0))
            except ValueError:
                length = -1
            if length < 0 or length > MAX_BODY_BYTES:
                self.close_connection = True  # the body is left unread
                if length < 0:
                    return self._answer(400, {"code": "bad_request",
                                              "detail": "Content-Length: a byte count"})
                return self._answer(413, {"code": "payload_too_large",
                                          "detail": f"at most {MAX_BODY_BYTES} bytes"})
            try:
                body = json.loads(self.rfile.read(length))
                token, key, value = body["token"], str(body["key"]), body.get("value")
            except (ValueError, KeyError, TypeError):
                return self._answer(400, {"code": "bad_request",
                                          "detail": 'JSON {"token", "key", "value"}'})
            try:
                claims = store.write(token, key, value)
            except FencingTokenError as exc:
                return self._answer(401, {"code": "invalid_token", "reason": exc.reason,
                                          "detail": str(exc)})
            except StaleAttempt as exc:
                return self._answer(409, {"code": "stale_attempt", "detail": str(exc),
                                          "attempt": exc.claims.attempt,
                                          "highest_attempt": exc.highest})
            return self._answer(200, {"accepted": True, "job_id": claims.job_id,
                                      "attempt": claims.attempt})

        def do_GET(self):  # noqa: N802
            url = urlsplit(self.path)
            if url.path != "/read":
                return self._answer(404, {"code": "not_found"})
            key = parse_qs(url.query).get("key", [""])[0]
            stored = store.read(key)
            if stored is None:
                return self._answer(404, {"code": "not_found"})
            return self._answer(200, {"key": key, "value": stored.value,
                                      "job_id": stored.job_id, "attempt": stored.attempt})

    return Handler


def serve(store: FencedStore, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """An HTTP server for `store` (not started: call serve_forever())."""
    return ThreadingHTTPServer((host, port), _handler(store))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m jobqueue_client.fenced_store",
        description="A fenced store over HTTP: fetches the service's key set once, then "
        "verifies every write's fencing token offline and refuses stale attempts.")
    parser.add_argument("--server", required=True, help="the service's base URL (JWKS)")
    parser.add_argument("--workspace", help="accept only this workspace's tokens")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args(argv)
    store = FencedStore(fetch_jwks(args.server), workspace_id=args.workspace,
                        refresh=lambda: fetch_jwks(args.server))
    httpd = serve(store, args.host, args.port)
    # SIGINT (ctrl-c) and SIGTERM (a supervisor) both stop it cleanly, with status 0. Set
    # here, not left to Python's default: a process started in the background of a script
    # inherits SIGINT ignored, and Python then leaves it ignored.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _stop)
    print(f"fenced store listening on http://{args.host}:{httpd.server_address[1]}", flush=True)
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()


def _stop(signum, frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    main()
