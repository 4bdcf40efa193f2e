import json
import math
import sys

from django.core.management.base import BaseCommand, CommandError

from jobqueue.maintenance import loop
from jobqueue.management.command_base import stop_on_signals


class Command(BaseCommand):
    help = (
        "Run every maintenance service (the reaper, the schedules, the group watcher, the "
        "webhook sender, the pruner, the artifact cleaner) once, or with --loop each whenever "
        "it is due (its own interval, or --interval for all) until SIGTERM or SIGINT."
    )

    def add_arguments(self, parser):
        parser.add_argument("--loop", action="store_true", help="run until stopped")
        parser.add_argument("--interval", type=float, default=None,
                            help="with --loop: seconds between runs of every service "
                                 "(default: each service's own interval)")
        parser.add_argument("--json", action="store_true", help="one JSON object per run")

    def handle(self, *args, **opts):
        interval = opts["interval"]
        if interval is not None and not (interval > 0 and math.isfinite(interval)):
            raise CommandError("--interval must be a positive number of seconds")
        if not opts["loop"]:
            outcomes = loop.run_once()
            for outcome in outcomes:
                self._print(outcome, opts["json"])
            failed = [o.service for o in outcomes if o.error]
            if failed:
                raise CommandError(f"maintenance failed: {', '.join(failed)}")
            return

        stopping = stop_on_signals()
        every = f"every {interval}s" if interval else "each service on its own interval"
        self.stderr.write(f"maintenance looping, {every} (SIGTERM to stop)")

        def report(outcome):
            if outcome.error:
                self.stderr.write(f"{outcome.service} failed, will retry: {outcome.error}")
            elif opts["json"] or any(v for k, v in outcome.counts.items() if k != "batches"):
                self._print(outcome, opts["json"])

        loop.run_forever(stop=stopping, interval=interval, on_outcome=report)
        self.stderr.write("maintenance stopped")

    def _print(self, outcome, as_json):
        if as_json:
            self.stdout.write(json.dumps(outcome.as_dict()))
        elif outcome.error:
            self.stdout.write(f"{outcome.service}: failed: {outcome.error}")
        else:
            counts = ", ".join(f"{k} {v}" for k, v in outcome.counts.items())
            self.stdout.write(f"{outcome.service}: {counts}")
        sys.stdout.flush()
