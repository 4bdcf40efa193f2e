"""Rate limits per credential: one counter per agent (token) or per workspace API key.

Rates are DRF's `DEFAULT_THROTTLE_RATES` (scopes `agent` and `workspace`), set from the
environment in config/settings.py and read on every request. A fixed one-period window with a
single counter per credential (two cache operations a request) replaces DRF's timestamp
list, whose cost grows with the rate. Counters live in the `default` cache: the default LocMem
cache is per process, so N server processes allow up to N times the rate.
"""

from __future__ import annotations

import time

from django.core.cache import cache
from rest_framework.settings import api_settings
from rest_framework.throttling import SimpleRateThrottle

DISABLED = {"", "0", "none", "off"}


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

    def allow_request(self, request, view):
        principal = getattr(request, "user", None)
        ident = getattr(principal, "throttle_ident", None)
        if ident is None:
            return True
        self.scope = "agent" if principal.is_agent else "workspace"
        self.rate = self.get_rate()
        if self.rate is None:
            return True
        self.num_requests, self.duration = self.parse_rate(self.rate)
        now = time.time()
        window = int(now // self.duration)
        key = f"throttle:{self.scope}:{ident}:{window}"
        self.wait_seconds = (window + 1) * self.duration - now
        if self.cache.add(key, 1, timeout=self.duration + 1):
            return True
        try:
            count = self.cache.incr(key)
        except ValueError:  # expired between add() and incr()
            self.cache.add(key, 1, timeout=self.duration + 1)
            return True
        return count <= self.num_requests

    def wait(self):
        return self.wait_seconds
