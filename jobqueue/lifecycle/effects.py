"""The effect ledger: what a job's attempts did outside the service that must happen at most
once (charge a card, send an email, call a paid model), one row per job and key
(docs/effects.md).

An attempt asks before it acts (`begin_effect`) and records the outcome after
(`commit_effect`). What a begin answers:

    started    no attempt began it; this attempt now has (a repeat by it answers the same)
    unknown    an earlier attempt (`attempt`) began it and recorded no outcome: it may or may
               not have happened; this attempt now holds it, reconciles with the outside
               system (the `effect_id` is that system's idempotency key) and commits
    committed  done, with its `result`: do not do it again

Both writes are guarded by the claim like every agent write, as a checkpoint is: the
backend's `hold_claim` finds the claim current (its row, this claim_id, the caller's scope,
its deadline not passed) and holds it until the write's transaction ends (PostgreSQL:
claim_hold_if_current, the claim row FOR SHARE; SQLite: the transaction's write lock). A
reap, release, report, requeue or cancel ending the claim waits for a begin or commit in
flight, or the begin or commit finds the claim gone and writes nothing. The job row is not
locked (only the foreign key's KEY SHARE), so a claim's SKIP LOCKED never skips a job for a
stale writer. A refused write is explained and recorded as every other (refusals.refuse_one,
operation "effect").

The rows belong to the job, not to an attempt: retries, reaps and requeues keep them, prune
deletes them with their job.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

from django.db import IntegrityError, transaction
from django.db.models.functions import Now

from jobqueue.conf import jobqueue_settings
from jobqueue.exceptions import (
    ClaimSuperseded,
    EffectAlreadyCommitted,
    EffectNotBegun,
    InvalidInput,
    OutputTooLarge,
)
from jobqueue.models import JobEffect

from .backends import backend
from .inputs import report_content
from .records import fetch_job, scoped_jobs
from .refusals import refuse_one

EFFECT = "effect"
STARTED, UNKNOWN, COMMITTED = "started", "unknown", "committed"
KEY = re.compile(r"[A-Za-z0-9._:-]{1,200}")


@dataclass(frozen=True)
class EffectAnswer:
    """What a begin or a commit answers the attempt that asked."""

    state: str  # STARTED, UNKNOWN or COMMITTED
    effect_id: uuid.UUID
    attempt: int  # started: this one; unknown: the earlier one; committed: the committer
    result: object = None  # committed only
    created: bool = False  # this begin created the entry (201)


def effect_key(key: str) -> str:
    """1 to 200 of [A-Za-z0-9._:-], and not "." or "..": the key is a path segment, and URL
    clients remove dot segments (the reference client refuses keys of dots only)."""
    if not isinstance(key, str) or KEY.fullmatch(key) is None or key in (".", ".."):
        raise InvalidInput('key must be 1 to 200 characters of A-Z a-z 0-9 . _ : -, and not '
                           '"." or ".."', field="key")
    return key


def same_result(recorded, given) -> bool:
    """Is `given` the result already recorded, as JSON values? Python's == is not: it takes
    `true` for `1` (and `false` for `0`, `0.0`), so another result would be accepted as the
    same one. Numbers still compare by value (`1` is `1.0`), as PostgreSQL's jsonb does, and
    must: jsonb gives back a float `1e20` as the integer 100000000000000000000, so comparing
    canonical texts would refuse an honest repeat."""
    if isinstance(recorded, bool) or isinstance(given, bool):
        return type(recorded) is type(given) and recorded == given
    if isinstance(recorded, dict):
        return (isinstance(given, dict) and recorded.keys() == given.keys()
                and all(same_result(value, given[name]) for name, value in recorded.items()))
    if isinstance(recorded, list):
        return (isinstance(given, list) and len(recorded) == len(given)
                and all(map(same_result, recorded, given)))
    return recorded == given


def _held_attempt(job_id, claim_id, workspace_id, job_agent_id) -> int | None:
    """The claim's attempt if it is current, held until the caller's transaction ends."""
    return backend().hold_claim(job_id, claim_id, job_agent_id, workspace_id)


def _locked(job_id, key) -> JobEffect | None:
    """The entry, its row locked until the caller's transaction ends: the holder's own
    begins and commits of one key, racing (an agent's retry), take turns (SQLite: the
    transaction's write lock)."""
    return JobEffect.objects.select_for_update().filter(job_id=job_id, key=key).first()


def _room_for_one_more(job_id) -> None:
    """A new key's entry fits the job's ledger (JOBQUEUE_MAX_EFFECTS_PER_JOB), else 413
    output_too_large. Counted under the ledger's lock (backend.lock_effect_ledger: an
    advisory lock on PostgreSQL, not the job row's, which a report or the reaper takes
    before the claim row this begin holds; SQLite: the transaction's write lock), so that
    racing begins of new keys never pass the cap."""
    cap = jobqueue_settings()["MAX_EFFECTS_PER_JOB"]
    backend().lock_effect_ledger(job_id)
    if JobEffect.objects.filter(job_id=job_id).count() >= cap:
        raise OutputTooLarge(f"A job's effect ledger holds at most {cap} entries.")


def _refuse(job_id, claim_id, workspace_id, job_agent_id):
    refuse_one(job_id, claim_id, EFFECT, workspace_id=workspace_id, job_agent_id=job_agent_id)
    raise ClaimSuperseded()  # pragma: no cover - refuse_one raises for an effect write


def _committed(row: JobEffect) -> EffectAnswer:
    return EffectAnswer(COMMITTED, row.id, row.committed_attempt, row.result)


def begin_effect(job_id: uuid.UUID, claim_id: uuid.UUID, key: str, *, workspace_id=None,
                 job_agent_id=None) -> EffectAnswer:
    """Begin the effect `key` for the claim's attempt, or say who did (module docstring)."""
    key = effect_key(key)
    with transaction.atomic():
        attempt = _held_attempt(job_id, claim_id, workspace_id, job_agent_id)
        if attempt is not None:
            row = _locked(job_id, key)
            if row is None:
                _room_for_one_more(job_id)
                try:
                    with transaction.atomic():
                        row = JobEffect.objects.create(job_id=job_id, key=key,
                                                       attempt=attempt, claim_id=claim_id)
                    return EffectAnswer(STARTED, row.id, attempt, created=True)
                except IntegrityError:  # the same attempt's begin, racing this one, made it
                    row = _locked(job_id, key)
            if row.committed:
                return _committed(row)
            if row.claim_id != claim_id:  # an earlier attempt's: this one takes it over
                JobEffect.objects.filter(pk=row.pk).update(
                    attempt=attempt, claim_id=claim_id, earlier_attempt=row.attempt)
                return EffectAnswer(UNKNOWN, row.id, row.attempt)
            if row.earlier_attempt is None:  # this attempt's own begin, again
                return EffectAnswer(STARTED, row.id, attempt, created=True)
            return EffectAnswer(UNKNOWN, row.id, row.earlier_attempt)
    _refuse(job_id, claim_id, workspace_id, job_agent_id)


def commit_effect(job_id: uuid.UUID, claim_id: uuid.UUID, key: str, result, *,
                  workspace_id=None, job_agent_id=None) -> EffectAnswer:
    """Record the outcome of the effect `key`, which the claim's attempt began: once (the
    same result again is accepted unchanged, also once the claim has ended; another is
    EffectAlreadyCommitted)."""
    key = effect_key(key)
    report_content(None, result)
    with transaction.atomic():
        attempt = _held_attempt(job_id, claim_id, workspace_id, job_agent_id)
        if attempt is not None:
            row = _locked(job_id, key)
            if row is not None and row.committed:
                if not same_result(row.result, result):
                    raise EffectAlreadyCommitted()
                return _committed(row)
            if row is None or row.claim_id != claim_id:
                raise EffectNotBegun()
            JobEffect.objects.filter(pk=row.pk).update(
                result=result, committed_attempt=attempt, committed_at=Now())
            return EffectAnswer(COMMITTED, row.id, attempt, result)
    # Its own commit again after its claim ended (a retry after a lost answer): accepted,
    # as a final report's repeat is. A committed row keeps its committer's claim_id (a begin
    # answers `committed` without taking it over).
    mine = (JobEffect.objects.filter(job_id=job_id, key=key, claim_id=claim_id,
                                     committed_at__isnull=False,
                                     job__in=scoped_jobs(workspace_id, job_agent_id))
            .first())
    if mine is not None and same_result(mine.result, result):
        return _committed(mine)
    _refuse(job_id, claim_id, workspace_id, job_agent_id)


def effects_of(job_id: uuid.UUID, *, workspace_id=None) -> list[JobEffect]:
    """The job's ledger, oldest first (NotFound for a job the caller cannot see)."""
    job = fetch_job(job_id, workspace_id=workspace_id)
    return list(JobEffect.objects.filter(job_id=job.id).order_by("begun_at", "key"))
