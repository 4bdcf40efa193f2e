"""`Backoff`: exponential backoff with jitter, shared by the agent's threads (claims,
heartbeats, reports, releases, log and artifact uploads)."""

from __future__ import annotations

import random


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
