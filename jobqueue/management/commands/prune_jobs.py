import json
import math

from django.core.management.base import CommandError

from jobqueue.maintenance import pruner
from jobqueue.management.command_base import BatchCommand


class Command(BatchCommand):
    help = (
        "Delete finished jobs (with their events, claims and every row that belongs to them) "
        "whose completed_at is older than their status's retention: JOBQUEUE_RETENTION_DAYS "
        "(successful, cancelled) and JOBQUEUE_RETENTION_FAILED_DAYS (failure, expired). Never "
        "a job that is not finished."
    )

    def add_arguments(self, parser):
        parser.add_argument("--older-than", type=float, default=None, metavar="DAYS",
                            help="one retention for every finished status (days, > 0)")
        self.add_batch_arguments(
            parser, batch_size_help="jobs per transaction (default: JOBQUEUE_PRUNE_BATCH_SIZE)")
        self.add_output_arguments(parser,
                                  dry_run_help="count what would be deleted; delete nothing",
                                  json_help="print one JSON object (and no progress line)")

    def handle(self, *args, **opts):
        older_than = opts["older_than"]
        if older_than is not None and not (older_than > 0 and math.isfinite(older_than)):
            raise CommandError("--older-than must be a positive number of days")
        self.check_batch_options(opts)
        result = self.run_batches(
            "finished jobs deleted", opts,
            lambda on_batch: pruner.run_once(
                older_than_days=older_than, batch_size=opts["batch_size"],
                max_batches=opts["max_batches"], dry_run=opts["dry_run"], on_batch=on_batch),
            failed="prune")
        if opts["json"]:
            self.stdout.write(json.dumps(result.as_dict()))
            return
        verb = "would delete" if result.dry_run else "deleted"
        detail = ", ".join(f"{status} {n}" for status, n in result.by_status.items())
        self.stdout.write(f"{verb} {result.jobs} finished job(s)"
                          + (f" ({detail})" if detail else "")
                          + f" in {result.batches} batch(es), {result.duration_seconds:.3f}s")
