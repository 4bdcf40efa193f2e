"""Progress of a long command on a terminal: one line on stderr, rewritten after each batch
(`\\r`), ended with a newline. Silent when stderr is not a terminal (cron, systemd, a pipe)
and with --json, so scripts read only the result on stdout."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, what: str, *, enabled: bool, stream=None):
        self.what = what  # e.g. "jobs deleted"
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled and self.stream.isatty()
        self.started = time.monotonic()
        self.wrote = False

    @classmethod
    def for_command(cls, what: str, opts: dict) -> Progress:
        return cls(what, enabled=not opts.get("json"))

    def __call__(self, batches: int, done: int) -> None:
        """After each batch: how many batches and items so far."""
        if not self.enabled:
            return
        took = time.monotonic() - self.started
        self.stream.write(f"\r{done} {self.what} in {batches} batch(es), {took:.0f} s ...")
        self.stream.flush()
        self.wrote = True

    def finish(self) -> None:
        if self.wrote:
            self.stream.write("\n")
            self.stream.flush()
            self.wrote = False
