"""Rate limits per credential: one counter per agent (token) or per workspace API key.

Rates are DRF's `DEFAULT_THROTTLE_RATES` (scopes `agent` and `workspace`), set from the
environment in config/settings.py and read on every request. A fixed one-period window with a
single counter per credential (two cache operations a request) replaces DRF's timestamp
list, whose cost grows with the rate. Counters live in the `default` cache: the default LocMem
cache is per process, so N server processes allow up to N times the rate; with
`CACHE_URL=redis://...` (Django's built-in Redis cache) every replica shares one counter.

A cache that fails (Redis down, a timeout) never fails a request: the request is allowed (no
throttling), the failure is logged once per outage and counted (observe kind
`throttle_cache_failed`, `/metrics`: jobqueue_throttle_cache_failures_total), and the cache
is left alone for THROTTLE_CACHE_RETRY_SECONDS before the next try, so that an outage costs
the requests nothing but that one failed call.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time

from django.core.cache import cache
from rest_framework.settings import api_settings
from rest_framework.throttling import SimpleRateThrottle

from jobqueue import observe

DISABLED = {"", "0", "none", "off"}
THROTTLE_CACHE_RETRY_SECONDS = 5.0
log = logging.getLogger("agents.throttling")

_state_lock = threading.Lock()
_down_until = 0.0  # time.monotonic() until which the cache is not tried again


def _cache_is_resting() -> bool:
    return time.monotonic() < _down_until


def _cache_failed(exc: Exception) -> None:
    global _down_until
    with _state_lock:
        first = _down_until == 0.0
        _down_until = time.monotonic() + THROTTLE_CACHE_RETRY_SECONDS
    if first:
        log.warning("throttle cache unavailable (%s): requests are not throttled until it "
                    "answers again", type(exc).__name__)
    observe.emit("throttle_cache_failed", error=type(exc).__name__)


def _cache_answered() -> None:
    global _down_until
    if _down_until:
        with _state_lock:
            _down_until = 0.0
        log.warning("throttle cache answers again: throttling resumed")


def reset_cache_state() -> None:
    """Forget a recorded outage (tests)."""
    global _down_until
    with _state_lock:
        _down_until = 0.0


class CredentialRateThrottle(SimpleRateThrottle):
    """Scope `agent` for agent tokens, `workspace` for workspace API keys."""

    cache = cache

    def __init__(self):  # rates are read per request (see get_rate), not at import
        pass

    def get_rate(self):
        rate = api_settings.DEFAULT_THROTTLE_RATES.get(self.scope)
        if rate is None or str(rate).strip().lower() in DISABLED:
            return None
        return rate

    def scope_and_ident(self, request) -> tuple[str, str | None]:
        """The rate's scope and the counter's owner (None: not throttled)."""
        principal = getattr(request, "user", None)
        ident = getattr(principal, "throttle_ident", None)
        if ident is None:
            return "", None
        return ("agent" if principal.is_agent else "workspace"), ident

    def allow_request(self, request, view):
        self.scope, ident = self.scope_and_ident(request)
        if ident is None:
            return True
        self.rate = self.get_rate()
        if self.rate is None:
            return True
        self.num_requests, self.duration = self.parse_rate(self.rate)
        now = time.time()
        window = int(now // self.duration)
        key = f"throttle:{self.scope}:{ident}:{window}"
        self.wait_seconds = (window + 1) * self.duration - now
        if _cache_is_resting():
            return True
        try:
            allowed = self._count(key)
        except Exception as exc:  # noqa: BLE001 - any cache failure: not throttled, logged
            _cache_failed(exc)
            return True
        _cache_answered()
        return allowed

    def _count(self, key: str) -> bool:
        if self.cache.add(key, 1, timeout=self.duration + 1):
            return True
        try:
            count = self.cache.incr(key)
        except ValueError:  # pragma: no cover -- expired between add() and incr(): a race
            self.cache.add(key, 1, timeout=self.duration + 1)
            return True
        return count <= self.num_requests

    def wait(self):
        return self.wait_seconds


class RegistrationRateThrottle(CredentialRateThrottle):
    """POST /v1/register, which takes no credential: scope `register`, one counter per client
    address (REMOTE_ADDR; behind proxies, the X-Forwarded-For entry JOBQUEUE_NUM_PROXIES
    points at, never the header alone: with the default 0 a client cannot pick its own)."""

    def scope_and_ident(self, request) -> tuple[str, str | None]:
        # Hashed: an address (or what a proxy wrote) never makes an over-long cache key.
        address = hashlib.sha256(str(self.get_ident(request)).encode()).hexdigest()[:32]
        return "register", f"addr:{address}"
