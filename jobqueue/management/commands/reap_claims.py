import json
import sys

from django.core.management.base import CommandError

from jobqueue.conf import jobqueue_settings
from jobqueue.maintenance import loop, reaper
from jobqueue.management.command_base import BatchCommand, stop_on_signals


class Command(BatchCommand):
    help = (
        "Enforce the three clocks: return jobs whose lease or max_runtime_seconds ran out to "
        "the queue (or end them as expired on their last attempt), and end jobs past their "
        "expires_at as expired. One sweep by default; --loop keeps sweeping until SIGTERM or "
        "SIGINT."
    )

    def add_arguments(self, parser):
        self.add_batch_arguments(parser,
                                 batch_size_help="claims per transaction "
                                                 "(default: JOBQUEUE_REAPER_BATCH_SIZE, 500)",
                                 max_batches_help="stop a sweep after this many batches")
        parser.add_argument("--loop", action="store_true", help="sweep until stopped")
        parser.add_argument("--interval", type=float, default=None,
                            help="seconds between sweeps with --loop")
        self.add_output_arguments(parser,
                                  dry_run_help="count what would be reaped; change nothing",
                                  json_help="one JSON object per sweep (and no progress line)")

    def handle(self, *args, **opts):
        self.check_batch_options(opts)
        interval = opts["interval"]
        if interval is None:
            interval = jobqueue_settings()["REAPER_INTERVAL_SECONDS"]
        if interval <= 0:
            raise CommandError("--interval must be positive")

        if not opts["loop"]:
            # One sweep: a progress line on a terminal (the loop's sweeps print their counts).
            result = self.run_batches(
                "claims reaped", opts,
                lambda on_batch: reaper.run_once(
                    batch_size=opts["batch_size"], max_batches=opts["max_batches"],
                    dry_run=opts["dry_run"], on_batch=on_batch),
                failed="reap")
            self._print(result, opts["json"])
            return

        if opts["dry_run"]:
            raise CommandError("--dry-run cannot be combined with --loop")
        stopping = stop_on_signals()
        self.stderr.write(f"reaper looping every {interval}s (SIGTERM to stop)")
        # The maintenance loop with the reaper alone, swept with this command's options.
        sweeps = reaper.Sweeps(batch_size=opts["batch_size"], max_batches=opts["max_batches"])

        def report(outcome):
            if outcome.error:
                self.stderr.write(f"reap failed, will retry: {outcome.exception}")
            elif sweeps.last.requeued or sweeps.last.expired or opts["json"]:
                self._print(sweeps.last, opts["json"])

        loop.run_forever(stop=stopping, interval=interval, services=(sweeps,),
                         on_outcome=report, own_command=True)
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
