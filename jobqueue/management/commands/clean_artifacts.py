import json

from jobqueue.conf import jobqueue_settings
from jobqueue.maintenance import artifact_cleaner
from jobqueue.management.command_base import BatchCommand


class Command(BatchCommand):
    help = (
        "Delete the files and rows of artifacts that can never be published: staged by an "
        "attempt that did not succeed (reaped, released, superseded, failed, cancelled), "
        "left by an interrupted upload, or replaced by a newer upload of the same name. "
        "Bounded batches; safe to run while agents upload and report."
    )

    def add_arguments(self, parser):
        self.add_batch_arguments(parser, batch_size_help="artifacts per batch (default: "
                                                         "JOBQUEUE_ARTIFACT_CLEAN_BATCH_SIZE, 500)")
        self.add_output_arguments(parser,
                                  dry_run_help="count what would be deleted; change nothing",
                                  json_help="one JSON object (and no progress line)")

    def handle(self, *args, **opts):
        if opts["batch_size"] is None:
            opts["batch_size"] = jobqueue_settings()["ARTIFACT_CLEAN_BATCH_SIZE"]
        self.check_batch_options(opts)
        result = self.run_batches(
            "artifacts deleted", opts,
            lambda on_batch: artifact_cleaner.run_once(
                opts["batch_size"], max_batches=opts["max_batches"], dry_run=opts["dry_run"],
                on_batch=on_batch))
        if opts["json"]:
            self.stdout.write(json.dumps({"deleted": result.deleted, "batches": result.batches,
                                          "dry_run": opts["dry_run"]}))
        else:
            verb = "would delete" if opts["dry_run"] else "deleted"
            self.stdout.write(f"{verb} {result.deleted} artifact(s) in {result.batches} "
                              "batch(es)")
