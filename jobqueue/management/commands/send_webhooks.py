from django.core.management.base import BaseCommand, CommandError

from jobqueue.maintenance import webhooks
from jobqueue.management.command_base import write_counts


class Command(BaseCommand):
    help = ("Send the webhook deliveries that are due, once (run_maintenance --loop does it "
            "continuously). Prints what became of them.")

    def add_arguments(self, parser):
        parser.add_argument("--limit", type=int, default=None,
                            help="most deliveries to send (default: JOBQUEUE_WEBHOOK_BATCH_SIZE)")
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args, **opts):
        if opts["limit"] is not None and opts["limit"] < 1:
            raise CommandError("--limit must be at least 1")
        counts = webhooks.run_once(limit=opts["limit"])
        write_counts(self.stdout, counts, opts["json"])
