"""Retention: deleting finished jobs, with everything that belongs to them, in bounded batches.

A job is deleted only when it is terminal and its `completed_at` is older than the cutoff, by
the database's clock. The batch takes the job rows with FOR UPDATE SKIP LOCKED (PostgreSQL) so
that a job being requeued at that moment is either left alone (its row is locked by the
requeue: skipped, and re-read next time) or deleted before the requeue's UPDATE runs (which
then finds no row: not_found). The DELETE repeats the guards in its WHERE. On SQLite the batch
is one BEGIN IMMEDIATE transaction, serialized against every other writer.

Every table that refers to a job (events, the claim, and whatever a later table adds: attempts,
logs, artifacts, deliveries) is emptied of the batch's rows first, in the same transaction:
such a relation must be on_delete=CASCADE (a test checks that every one is). The files of the
batch's artifacts are recorded in artifact_file_deletion in the same transaction and deleted
from their storage once it has committed; a file the storage fails to delete then, or one a
crash in between left, keeps its record, and the artifact cleaner deletes it later
(lifecycle/artifacts.py, delete_files): never a row without its file, and no file forgotten.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from django.db import transaction

from jobqueue import states
from jobqueue.db import NowPlusSeconds
from jobqueue.models import ArtifactFileDeletion, Job, JobArtifact

from .artifacts import delete_files


def prunable(statuses: Iterable[str], older_than_seconds: int):
    """Terminal jobs of `statuses` that finished more than `older_than_seconds` ago."""
    statuses = sorted(set(statuses) & states.TERMINAL)
    return Job.objects.filter(status__in=statuses,
                              completed_at__lt=NowPlusSeconds(-int(older_than_seconds)))


def prune_finished_once(statuses: Iterable[str], older_than_seconds: int,
                        batch_size: int) -> Counter:
    """Delete one batch (at most `batch_size` jobs); return how many of each status."""
    statuses = sorted(set(statuses) & states.TERMINAL)
    with transaction.atomic():
        rows = list(
            prunable(statuses, older_than_seconds)
            .order_by()
            .select_for_update(skip_locked=True, of=("self",))
            .values_list("id", "status")[:batch_size]
        )
        if not rows:
            return Counter()
        ids = [job_id for job_id, _status in rows]
        files = list(JobArtifact.objects.filter(job_id__in=ids)
                     .values_list("storage_key", flat=True))
        for relation in Job._meta.related_objects:
            relation.related_model._base_manager.filter(
                **{f"{relation.field.name}__in": ids}).delete()
        deleted = Job.objects.filter(id__in=ids, status__in=statuses,
                                     completed_at__isnull=False)._raw_delete(Job.objects.db)
        if deleted != len(ids):  # pragma: no cover - the rows are locked
            raise RuntimeError("prune: job rows changed under their locks")
        if files:
            ArtifactFileDeletion.objects.bulk_create(
                ArtifactFileDeletion(storage_key=key) for key in files)
            transaction.on_commit(lambda: delete_files(files))
    return Counter(status for _job_id, status in rows)
