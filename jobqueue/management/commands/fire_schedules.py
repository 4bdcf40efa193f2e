from django.core.management.base import BaseCommand, CommandError

from jobqueue.maintenance import schedules
from jobqueue.management.command_base import write_counts


class Command(BaseCommand):
    help = ("Fire every due schedule once: each fire time up to now creates its job, or is "
            "recorded skipped (the overlap policy) or missed (past the catch-up window) "
            "(run_maintenance --loop does it continuously). Safe beside every other process: "
            "a fire time is fired at most once.")

    def add_arguments(self, parser):
        parser.add_argument("--batch-size", type=int, default=None,
                            help="schedules per transaction (default: "
                                 "JOBQUEUE_SCHEDULE_BATCH_SIZE, 100)")
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args, **opts):
        if opts["batch_size"] is not None and opts["batch_size"] < 1:
            raise CommandError("--batch-size must be at least 1")
        counts = schedules.run_once(opts["batch_size"])
        write_counts(self.stdout, counts, opts["json"])
