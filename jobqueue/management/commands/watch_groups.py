from django.core.management.base import BaseCommand, CommandError

from jobqueue.maintenance import group_watcher
from jobqueue.management.command_base import write_counts


class Command(BaseCommand):
    help = ("Mark the groups whose last pending, queued or in-progress job has ended finished, "
            "once, writing their group.finished webhook deliveries (run_maintenance --loop "
            "does it continuously). Safe beside every other process.")

    def add_arguments(self, parser):
        parser.add_argument("--batch-size", type=int, default=None,
                            help="groups per transaction (default: "
                                 "JOBQUEUE_GROUP_WATCH_BATCH_SIZE, 500)")
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args, **opts):
        if opts["batch_size"] is not None and opts["batch_size"] < 1:
            raise CommandError("--batch-size must be at least 1")
        counts = group_watcher.run_once(opts["batch_size"])
        write_counts(self.stdout, counts, opts["json"])
