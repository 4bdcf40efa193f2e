import json

from django.core.management.base import BaseCommand, CommandError

from jobqueue.conf import jobqueue_settings
from jobqueue.lifecycle import artifacts
from jobqueue.management.progress import Progress


class Command(BaseCommand):
    help = (
        "Delete the files and rows of artifacts that can never be published: staged by an "
        "attempt that did not succeed (reaped, released, superseded, failed, cancelled), "
        "left by an interrupted upload, or replaced by a newer upload of the same name. "
        "Bounded batches; safe to run while agents upload and report."
    )

    def add_arguments(self, parser):
        parser.add_argument("--batch-size", type=int, default=None,
                            help="artifacts per batch (default: "
                                 "JOBQUEUE_ARTIFACT_CLEAN_BATCH_SIZE, 500)")
        parser.add_argument("--max-batches", type=int, default=None,
                            help="stop after this many batches")
        parser.add_argument("--dry-run", action="store_true",
                            help="count what would be deleted; change nothing")
        parser.add_argument("--json", action="store_true",
                            help="one JSON object (and no progress line)")

    def handle(self, *args, **opts):
        if opts["batch_size"] is None:
            opts["batch_size"] = jobqueue_settings()["ARTIFACT_CLEAN_BATCH_SIZE"]
        if opts["batch_size"] < 1:
            raise CommandError("--batch-size must be at least 1")
        if opts["max_batches"] is not None and opts["max_batches"] < 1:
            raise CommandError("--max-batches must be at least 1")
        progress = Progress.for_command("artifacts deleted", opts)
        try:
            result = artifacts.clean_artifacts(opts["batch_size"],
                                               max_batches=opts["max_batches"],
                                               dry_run=opts["dry_run"], on_batch=progress)
        finally:
            progress.finish()
        if opts["json"]:
            self.stdout.write(json.dumps({"deleted": result.deleted, "batches": result.batches,
                                          "dry_run": opts["dry_run"]}))
        else:
            verb = "would delete" if opts["dry_run"] else "deleted"
            self.stdout.write(f"{verb} {result.deleted} artifact(s) in {result.batches} "
                              "batch(es)")
