"""What the maintenance commands share: the batch commands' options (--batch-size,
--max-batches, --dry-run, --json) and their checks, the progress line around a run, and the
stop event of a --loop (SIGTERM, SIGINT), the counts a one-run command prints."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Callable

from django.core.management.base import BaseCommand, CommandError

from jobqueue.management.progress import Progress


class BatchCommand(BaseCommand):
    """A command that works in bounded batches (clean_artifacts, prune_jobs, reap_claims).

    Each command adds its own options between the shared ones, in its own order (--help)."""

    def add_batch_arguments(self, parser, *, batch_size_help: str,
                            max_batches_help: str = "stop after this many batches") -> None:
        parser.add_argument("--batch-size", type=int, default=None, help=batch_size_help)
        parser.add_argument("--max-batches", type=int, default=None, help=max_batches_help)

    def add_output_arguments(self, parser, *, dry_run_help: str, json_help: str) -> None:
        parser.add_argument("--dry-run", action="store_true", help=dry_run_help)
        parser.add_argument("--json", action="store_true", help=json_help)

    def check_batch_options(self, opts: dict) -> None:
        for name in ("batch_size", "max_batches"):
            if opts[name] is not None and opts[name] < 1:
                raise CommandError(f"--{name.replace('_', '-')} must be at least 1")

    def run_batches(self, what: str, opts: dict, run: Callable, *, failed: str | None = None):
        """run(on_batch=...) with a progress line ("<n> <what> in <b> batch(es)") on a
        terminal; an error becomes "<failed> failed: <type>: <message>" (failed=None: raised
        as it is)."""
        progress = Progress.for_command(what, opts)
        try:
            return run(on_batch=progress)
        except Exception as exc:
            if failed is None:
                raise
            raise CommandError(f"{failed} failed: {type(exc).__name__}: {exc}") from exc
        finally:
            progress.finish()


def write_counts(stdout, counts: dict, as_json: bool) -> None:
    """A one-run command's counts: one JSON object, or "name n, name n"."""
    if as_json:
        stdout.write(json.dumps(counts))
    else:
        stdout.write(", ".join(f"{k} {v}" for k, v in counts.items()))


def stop_on_signals() -> threading.Event:
    """An event set on SIGTERM or SIGINT: a --loop ends when it is set."""
    stopping = threading.Event()

    def stop(signum, frame):
        # Set from another thread: the handler runs in the main thread, which may be
        # inside stopping.wait() holding the event's lock at that very moment.
        threading.Thread(target=stopping.set, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    return stopping
