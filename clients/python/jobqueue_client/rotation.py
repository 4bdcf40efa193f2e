"""The agent rotates its own token (docs/cli.md, "Registering and token rotation").

Run with a config file whose token expires, the agent rotates it at 75 % of its lifetime
(`POST job-agents/{id}/tokens/rotate`), in this order:

1. ask for the new token (the old one keeps working until its own expiry: the overlap asked
   is the largest, which the server caps there);
2. write it to the config file, atomically (agentconfig.save: a temporary file, fsync, rename);
3. only then send it (AgentClient.set_token).

So a SIGKILL at any point leaves a working token in the file: before 2, the old one (still in
its overlap; the agent started again finds rotation due and rotates again, and the server, by
its lost-answer rule, revokes the successor nobody received and issues another); after 2, the
new one. A rotation that fails for the network, the server, a throttle or a file that could not
be written is tried again; one the server refuses (the token expired or was revoked) is logged
and left: the agent's requests then fail with that answer. One agent process per config file:
two would rotate each other's tokens away. The token is never logged.
"""

from __future__ import annotations

import logging
import threading
import time

from . import agentconfig
from .errors import ApiError, AuthError, Conflict, ServerError, Throttled, TransportError

log = logging.getLogger("jobqueue.agent")

# The overlap asked for: the largest the server allows, which it caps at the old token's own
# expiry. So an old token whose rotation's answer was lost (the agent killed before it stored
# the new one) works on until it would have expired anyway, the last quarter of its lifetime,
# for the agent started again to rotate with.
OVERLAP_SECONDS = 86400
RETRY_MIN_SECONDS = 1.0
RETRY_MAX_SECONDS = 30.0
# The longest single wait (a far expiry is waited for in steps; the OS caps a timeout).
MAX_WAIT_SECONDS = 3600.0


class TokenRotator:
    """A daemon thread that keeps the agent's token fresh (see the module's docstring)."""

    def __init__(self, client, config_path, config: agentconfig.AgentConfig, *,
                 overlap_seconds: int = OVERLAP_SECONDS, clock=time.time):
        self.client = client
        self.path = config_path
        self.config = config
        self.overlap_seconds = overlap_seconds
        self.clock = clock
        self.rotations = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="token-rotation", daemon=True)

    def start(self) -> TokenRotator:
        if self.config.rotate_after() is not None:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        retry = RETRY_MIN_SECONDS
        while True:  # each wait below returns at once, True, once stop() was called
            due = self.config.rotate_after()
            if due is None:  # pragma: no cover -- a rotated token that no longer expires
                return
            if self._stop.wait(min(MAX_WAIT_SECONDS, max(0.0, due - self.clock()))):
                return
            if self.clock() < due:  # a long wait, in steps
                continue
            try:
                self.rotate_once()
                retry = RETRY_MIN_SECONDS
            except (TransportError, ServerError, Throttled, OSError) as exc:
                # The network, the server, a throttle, or the file could not be written (the
                # new token was never sent: the next try's lost-answer rule replaces it).
                log.warning("event=token_rotation_failed code=%s retry_in=%.0fs",
                            getattr(exc, "code", type(exc).__name__), retry)
                if self._stop.wait(retry):
                    return
                retry = min(RETRY_MAX_SECONDS, retry * 2)
            except (AuthError, Conflict, ApiError) as exc:
                log.error("event=token_rotation_refused code=%s: the agent keeps its token "
                          "until it stops working; an operator can issue a new one",
                          getattr(exc, "code", type(exc).__name__))
                return

    def rotate_once(self) -> agentconfig.AgentConfig:
        """Rotate now: ask, store, then send (in that order). Returns the new config."""
        body, server_date = self.client.rotate_token(self.overlap_seconds)
        fresh = self.config.with_token(body["token"], body.get("token_expires_at"),
                                       server_date)
        agentconfig.save(self.path, fresh)
        self.client.set_token(fresh.token)
        self.config = fresh
        self.rotations += 1
        log.info("event=token_rotated token_expires_at=%s previous_token_expires_at=%s",
                 fresh.token_expires_at, body.get("previous_token_expires_at"))
        return fresh
