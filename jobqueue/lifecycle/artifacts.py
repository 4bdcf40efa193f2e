"""Job artifacts: files an attempt uploads while it holds its claim, staged per claim, and
published as the job's artifact set by that claim's accepted `successful` report, in the
report's own statement (jobqueue/sql/postgresql.sql; orm.py on SQLite). Nothing else ever publishes.

An upload is three short steps, none of them holding a transaction across the transfer:

1. `uploading` row: the claim must be current (the job row is locked and checked, as the
   report checks it); the row names the storage key before a byte is written, so a crash
   during the transfer leaves a row that clean-up finds.
2. the body streams to the artifact storage (Django's storage API, `STORAGES["artifacts"]`)
   in 64 KiB pieces, hashed and counted on the way, refused past MAX_ARTIFACT_BYTES.
3. `staged`: the claim is checked again under the job row's lock, with the attempt's caps
   (MAX_ARTIFACTS_PER_ATTEMPT files, MAX_ATTEMPT_ARTIFACT_BYTES bytes); a staged artifact of
   the same name becomes `replaced`, and its file and row are deleted once that commits (so
   replacing never takes an attempt past its caps on disk). A claim that ended meanwhile
   keeps nothing it sent.

`clean_artifacts` deletes, in bounded batches, the files and rows of everything unpublished
whose claim is no longer live (abandoned, reaped, superseded, failed attempts, crashed
uploads) and every replaced file an upload could not delete itself.
"""

from __future__ import annotations

import hashlib
import logging
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from django.core.files import File
from django.core.files.storage import storages
from django.db import transaction
from django.db.models import Case, Count, Exists, OuterRef, Q, Sum, When
from django.db.models.functions import Now

from jobqueue import states
from jobqueue.conf import jobqueue_settings
from jobqueue.exceptions import InvalidInput, NotFound, OutputTooLarge
from jobqueue.models import ArtifactFileDeletion, JobArtifact, JobClaim

from .records import fetch_job, scoped_jobs
from .refusals import refuse_one

ARTIFACT = "artifact"
NAME = re.compile(r"[A-Za-z0-9._-]{1,200}")
MEDIA_TYPE = re.compile(r"[A-Za-z0-9!#$&^_.+-]{1,100}/[A-Za-z0-9!#$&^_.+-]{1,99}")
PIECE = 64 * 1024
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ArtifactInfo:
    name: str
    size: int
    sha256: str
    attempt: int
    content_type: str


@dataclass(frozen=True)
class CleanResult:
    deleted: int = 0
    batches: int = 0


def artifact_storage():
    return storages["artifacts"]


def artifact_name(name) -> str:
    """A file name: 1-200 of [A-Za-z0-9._-], not `.` or `..` (never a path)."""
    if not isinstance(name, str) or not NAME.fullmatch(name) or name in (".", ".."):
        raise InvalidInput("Must be 1-200 characters of A-Z a-z 0-9 . _ - (no paths).",
                           field="name")
    return name


def media_type(value) -> str:
    """The media type sent with an upload (kept as metadata, never used to render), or
    application/octet-stream for anything that is not a plain `type/subtype`."""
    value = (value or "").split(";")[0].strip().lower()
    return value if MEDIA_TYPE.fullmatch(value) else "application/octet-stream"


class _Counted:
    """A read-only, non-seekable stream over the request body that hashes and counts what
    it hands out and refuses to go past `cap` bytes. read(n) answers n bytes unless the body
    ends first (a storage that uploads in parts, S3's multipart, needs full parts), fetched
    PIECE bytes at a time; read() without n answers one PIECE, never the whole body."""

    closed = False

    def __init__(self, stream, cap: int):
        self.stream, self.cap = stream, cap
        self.size = 0
        self.hash = hashlib.sha256()

    def seekable(self) -> bool:
        return False

    def read(self, n=-1):
        want = PIECE if n is None or n < 0 else n
        parts, got = [], 0
        while got < want:
            data = self.stream.read(min(want - got, PIECE))
            if not data:
                break
            self.size += len(data)
            if self.size > self.cap:
                raise OutputTooLarge(f"An artifact holds at most {self.cap} bytes.")
            self.hash.update(data)
            parts.append(data)
            got += len(data)
        return b"".join(parts)


def _locked_job(job_id, claim_id, scope):
    """The job, locked, if `claim_id` is its current claim; else None."""
    return (
        scoped_jobs(**scope)
        .filter(id=job_id, status=states.IN_PROGRESS, last_claim_id=claim_id)
        .select_for_update(no_key=True, of=("self",))
        .only("id", "attempt")
        .first()
    )


def _discard(row: JobArtifact) -> None:
    artifact_storage().delete(row.storage_key)
    JobArtifact.objects.filter(pk=row.pk).delete()


def upload_artifact(job_id: uuid.UUID, claim_id: uuid.UUID, name: str, stream, *,
                    content_type: str = "", declared_size: int | None = None,
                    workspace_id=None, job_agent_id=None) -> ArtifactInfo:
    """Stage the body read from `stream` as the claim's artifact `name` (see the module)."""
    name = artifact_name(name)
    limits = jobqueue_settings()
    cap = limits["MAX_ARTIFACT_BYTES"]
    if declared_size is not None and declared_size > cap:
        raise OutputTooLarge(f"An artifact holds at most {cap} bytes.")
    scope = {"workspace_id": workspace_id, "job_agent_id": job_agent_id}
    with transaction.atomic():
        job = _locked_job(job_id, claim_id, scope)
        row = None
        if job is not None:
            row = JobArtifact.objects.create(
                job_id=job.id, attempt=job.attempt, claim_id=claim_id, name=name,
                content_type=media_type(content_type),
                storage_key=f"{job.id}/{job.attempt}/{uuid.uuid4().hex}/{name}",
            )
    if row is None:
        refuse_one(job_id, claim_id, ARTIFACT, **scope)
    body = _Counted(stream, cap)
    try:
        saved = artifact_storage().save(row.storage_key, File(body, name=name))
    except BaseException:
        _discard(row)
        raise
    if saved != row.storage_key:  # pragma: no cover - keys are unique; a storage may rename
        row.storage_key = saved
        JobArtifact.objects.filter(pk=row.pk).update(storage_key=saved)
    try:
        info, replaced = _stage(row, claim_id, body.size, body.hash.hexdigest(), limits, scope)
    except BaseException:
        _discard(row)
        raise
    _delete_replaced(replaced)
    return info


def _stage(row, claim_id, size, sha256, limits, scope):
    """(the staged artifact, the (id, storage key) of the one of its name it replaced)."""
    with transaction.atomic():
        job = _locked_job(row.job_id, claim_id, scope)
        if job is not None:
            others = JobArtifact.objects.filter(
                job_id=row.job_id, claim_id=claim_id, state=JobArtifact.STAGED
            ).exclude(name=row.name)
            totals = others.aggregate(files=Count("id"), size=Sum("size"))
            if (totals["files"] or 0) + 1 > limits["MAX_ARTIFACTS_PER_ATTEMPT"]:
                raise OutputTooLarge(
                    f"An attempt stages at most {limits['MAX_ARTIFACTS_PER_ATTEMPT']} artifacts.")
            if (totals["size"] or 0) + size > limits["MAX_ATTEMPT_ARTIFACT_BYTES"]:
                raise OutputTooLarge(
                    f"An attempt stages at most {limits['MAX_ATTEMPT_ARTIFACT_BYTES']} bytes.")
            same_name = JobArtifact.objects.filter(job_id=row.job_id, claim_id=claim_id,
                                                   name=row.name, state=JobArtifact.STAGED)
            replaced = list(same_name.values_list("id", "storage_key"))
            same_name.update(state=JobArtifact.REPLACED)
            JobArtifact.objects.filter(pk=row.pk).update(state=JobArtifact.STAGED, size=size,
                                                         sha256=sha256)
    if job is not None:
        return ArtifactInfo(row.name, size, sha256, row.attempt, row.content_type), replaced
    refuse_one(row.job_id, claim_id, ARTIFACT, **scope)
    raise NotFound("No such job.")  # pragma: no cover - refuse_one raises for an upload


def _delete_replaced(rows) -> None:
    """Delete the files, then the rows, of the artifacts a new upload just replaced, so the
    attempt's cap holds on disk too. A replaced row can never be published (publication
    takes staged rows only, under the job row's lock), so no transaction is needed; one the
    storage fails to delete is left for clean_artifacts."""
    done = set(_deleted_from_storage([key for _pk, key in rows], "replaced file"))
    JobArtifact.objects.filter(pk__in=[pk for pk, key in rows if key in done],
                               state=JobArtifact.REPLACED).delete()


def publish(job_id: uuid.UUID, claim_id: uuid.UUID) -> None:
    """Make the claim's staged artifacts the job's artifact set (the ORM path of an accepted
    successful report, inside its transaction; PostgreSQL does it in the report's
    statement). An earlier published set (a job requeued after success) is unpublished."""
    mine = Q(claim_id=claim_id, state=JobArtifact.STAGED)
    JobArtifact.objects.filter(Q(job_id=job_id) & (mine | Q(published_at__isnull=False))).update(
        published_at=Case(When(mine, then=Now()), default=None))


def published_artifacts(job_id: uuid.UUID, *, workspace_id=None):
    """The job's published artifact set, by name."""
    job = fetch_job(job_id, workspace_id=workspace_id)
    return list(JobArtifact.objects.filter(job_id=job.id, published_at__isnull=False)
                .order_by("name"))


def published_artifact(job_id: uuid.UUID, name: str, *, workspace_id=None) -> JobArtifact:
    """The job's published artifact `name`, or NotFound."""
    job = fetch_job(job_id, workspace_id=workspace_id)
    row = None
    if NAME.fullmatch(name):
        row = JobArtifact.objects.filter(job_id=job.id, name=name,
                                         published_at__isnull=False).first()
    if row is None:
        raise NotFound("No such artifact.")
    return row


def open_artifact(row: JobArtifact):
    """The artifact's file, opened for reading."""
    return artifact_storage().open(row.storage_key, "rb")


def unpublished_garbage():
    """Artifacts that can never be published: replaced, or of a claim no longer live."""
    live = JobClaim.objects.filter(job_id=OuterRef("job_id"), claim_id=OuterRef("claim_id"))
    return JobArtifact.objects.filter(published_at__isnull=True).filter(
        Q(state=JobArtifact.REPLACED) | ~Exists(live))


# Failures in a row after which a run stops asking the storage (it is down: each further
# try would wait out its timeout); what is left is tried on the next run.
STORAGE_FAILURES_IN_A_ROW = 5


def _deleted_from_storage(keys, what: str = "file") -> list[str]:
    """Delete each file from the artifact storage: the keys it deleted. One it fails to
    delete (a throttled request, a missing permission) is logged and left, and the others
    are still tried, until STORAGE_FAILURES_IN_A_ROW fail in a row (an outage)."""
    storage, done, failed = artifact_storage(), [], 0
    for key in keys:
        try:
            storage.delete(key)
        except Exception:  # noqa: BLE001 - its record stays: the cleaner tries it again
            logger.warning("artifact: could not delete the %s %s yet", what, key,
                           exc_info=True)
            failed += 1
            if failed >= STORAGE_FAILURES_IN_A_ROW:
                logger.warning("artifact: the storage refused %d deletions in a row: the "
                               "rest wait for the next clean-up", failed)
                break
            continue
        failed = 0
        done.append(key)
    return done


def delete_files(keys) -> int:
    """Delete the files `keys` of pruned artifacts (their artifact_file_deletion records),
    and the records of those the storage deleted: how many."""
    done = _deleted_from_storage(keys)
    if done:
        ArtifactFileDeletion.objects.filter(storage_key__in=done).delete()
    return len(done)


def clean_artifacts(batch_size: int, *, max_batches: int | None = None,
                    dry_run: bool = False,
                    on_batch: Callable[[int, int], None] | None = None) -> CleanResult:
    """Delete the files, then the rows, of unpublished_garbage(), and the files of pruned
    artifacts still recorded in artifact_file_deletion (lifecycle/prune.py), `batch_size`
    at a time; `on_batch(batches, deleted)` after each batch.

    No transaction is held across the storage: a row found here can never become published
    (its claim is gone), so it is read, its file deleted, then the row deleted. A crash in
    between leaves the row, and the next run deletes the (missing) file again. A file the
    storage fails to delete keeps its row for the next run; each run tries it once, unless
    the storage refuses STORAGE_FAILURES_IN_A_ROW in a row (then the run stops asking).
    `max_batches` bounds each kind (unpublished artifacts, pruned files) on its own."""
    if dry_run:
        return CleanResult(deleted=unpublished_garbage().count()
                           + ArtifactFileDeletion.objects.count())
    deleted = batches = 0
    for source in (_unpublished_batch, _pruned_batch):  # max_batches: each kind's
        after = of_source = 0
        while max_batches is None or of_source < max_batches:
            rows = source(after, batch_size)
            if not rows:
                break
            batches += 1
            of_source += 1
            keys = [k for _id, k in rows]
            done = _deleted_from_storage(keys)
            deleted += _forget(source, rows, done)
            after = rows[-1][0]
            if on_batch is not None:
                on_batch(batches, deleted)
            if len(rows) < batch_size or (not done and keys):  # the storage is down
                break
    return CleanResult(deleted=deleted, batches=batches)


def _unpublished_batch(after: int, size: int) -> list[tuple[int, str]]:
    return list(unpublished_garbage().filter(id__gt=after).order_by("id")
                .values_list("id", "storage_key")[:size])


def _pruned_batch(after: int, size: int) -> list[tuple[int, str]]:
    return list(ArtifactFileDeletion.objects.filter(id__gt=after).order_by("id")
                .values_list("id", "storage_key")[:size])


def _forget(source, rows, done_keys) -> int:
    """Delete the rows of `rows` whose files the storage deleted: how many."""
    done = set(done_keys)
    ids = [row_id for row_id, key in rows if key in done]
    if source is _unpublished_batch:
        return JobArtifact.objects.filter(id__in=ids, published_at__isnull=True).delete()[0]
    return ArtifactFileDeletion.objects.filter(id__in=ids).delete()[0]
