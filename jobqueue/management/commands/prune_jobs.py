import json
import math

from django.core.management.base import BaseCommand, CommandError

from jobqueue.maintenance import pruner
from jobqueue.management.progress import Progress


class Command(BaseCommand):
    help = (
        "Delete finished jobs (with their events, claims and every row that belongs to them) "
        "whose completed_at is older than their status's retention: JOBQUEUE_RETENTION_DAYS "
        "(successful, cancelled) and JOBQUEUE_RETENTION_FAILED_DAYS (failure, expired). Never "
        "a job that is not finished."
    )

    def add_arguments(self, parser):
        parser.add_argument("--older-than", type=float, default=None, metavar="DAYS",
                            help="one retention for every finished status (days, > 0)")
        parser.add_argument("--batch-size", type=int, default=None,
                            help="jobs per transaction (default: JOBQUEUE_PRUNE_BATCH_SIZE)")
        parser.add_argument("--max-batches", type=int, default=None,
                            help="stop after this many batches")
        parser.add_argument("--dry-run", action="store_true",
                            help="count what would be deleted; delete nothing")
        parser.add_argument("--json", action="store_true",
                            help="print one JSON object (and no progress line)")

    def handle(self, *args, **opts):
        older_than = opts["older_than"]
        if older_than is not None and not (older_than > 0 and math.isfinite(older_than)):
            raise CommandError("--older-than must be a positive number of days")
        for name in ("batch_size", "max_batches"):
            if opts[name] is not None and opts[name] < 1:
                raise CommandError(f"--{name.replace('_', '-')} must be at least 1")
        progress = Progress.for_command("finished jobs deleted", opts)
        try:
            result = pruner.run_once(older_than_days=older_than, batch_size=opts["batch_size"],
                                     max_batches=opts["max_batches"], dry_run=opts["dry_run"],
                                     on_batch=progress)
        except Exception as exc:  # noqa: BLE001 - turned into a clear exit status
            raise CommandError(f"prune failed: {type(exc).__name__}: {exc}") from exc
        finally:
            progress.finish()
        if opts["json"]:
            self.stdout.write(json.dumps(result.as_dict()))
            return
        verb = "would delete" if result.dry_run else "deleted"
        detail = ", ".join(f"{status} {n}" for status, n in result.by_status.items())
        self.stdout.write(f"{verb} {result.jobs} finished job(s)"
                          + (f" ({detail})" if detail else "")
                          + f" in {result.batches} batch(es), {result.duration_seconds:.3f}s")
