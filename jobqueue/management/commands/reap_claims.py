import json
import signal
import sys
import threading

from django.core.management.base import BaseCommand, CommandError

from jobqueue import reaper
from jobqueue.conf import jobqueue_settings
from jobqueue.management.progress import Progress


class Command(BaseCommand):
    help = (
        "Enforce the three clocks: return jobs whose lease or max_runtime_seconds ran out to "
        "the queue (or end them as expired on their last attempt), and end jobs past their "
        "expires_at as expired. One sweep by default; --loop keeps sweeping until SIGTERM or "
        "SIGINT."
    )

    def add_arguments(self, parser):
        parser.add_argument("--batch-size", type=int, default=None,
                            help="claims per transaction "
                                 "(default: JOBQUEUE_REAPER_BATCH_SIZE, 500)")
        parser.add_argument("--max-batches", type=int, default=None,
                            help="stop a sweep after this many batches")
        parser.add_argument("--loop", action="store_true", help="sweep until stopped")
        parser.add_argument("--interval", type=float, default=None,
                            help="seconds between sweeps with --loop")
        parser.add_argument("--dry-run", action="store_true",
                            help="count what would be reaped; change nothing")
        parser.add_argument("--json", action="store_true",
                            help="one JSON object per sweep (and no progress line)")

    def handle(self, *args, **opts):
        batch_size = opts["batch_size"]
        if batch_size is not None and batch_size < 1:
            raise CommandError("--batch-size must be at least 1")
        if opts["max_batches"] is not None and opts["max_batches"] < 1:
            raise CommandError("--max-batches must be at least 1")
        interval = opts["interval"]
        if interval is None:
            interval = jobqueue_settings()["REAPER_INTERVAL_SECONDS"]
        if interval <= 0:
            raise CommandError("--interval must be positive")

        if not opts["loop"]:
            # One sweep: a progress line on a terminal (the loop's sweeps print their counts).
            progress = Progress.for_command("claims reaped", opts)
            try:
                result = reaper.sweep(batch_size=batch_size, max_batches=opts["max_batches"],
                                      dry_run=opts["dry_run"], on_batch=progress)
            except Exception as exc:  # noqa: BLE001 - turned into a clear exit status
                raise CommandError(f"reap failed: {type(exc).__name__}: {exc}") from exc
            finally:
                progress.finish()
            self._print(result, opts["json"])
            return

        if opts["dry_run"]:
            raise CommandError("--dry-run cannot be combined with --loop")
        stopping = threading.Event()

        def stop(signum, frame):
            # Set from another thread: the handler runs in the main thread, which may be
            # inside stopping.wait() holding the event's lock at that very moment.
            threading.Thread(target=stopping.set, daemon=True).start()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        self.stderr.write(f"reaper looping every {interval}s (SIGTERM to stop)")
        reaper.run_forever(
            interval=interval,
            batch_size=batch_size,
            max_batches=opts["max_batches"],
            stop=stopping,
            on_result=lambda r: (r.requeued or r.expired or opts["json"])
            and self._print(r, opts["json"]),
            on_error=lambda e: self.stderr.write(f"reap failed, will retry: {e}"),
        )
        self.stderr.write("reaper stopped")

    def _print(self, result, as_json):
        if as_json:
            self.stdout.write(json.dumps(result.as_dict()))
        else:
            verb = "would requeue" if result.dry_run else "requeued"
            verb2 = "would expire" if result.dry_run else "expired"
            self.stdout.write(
                f"{verb} {result.requeued}, {verb2} {result.expired} "
                f"in {result.batches} batch(es), {result.duration_seconds:.3f}s"
            )
        sys.stdout.flush()
