"""Operator transitions (the API's workspace key, the admin): cancel, requeue, mark failed.

Each is one guarded UPDATE of the job row (which locks it), then the job's claim, if any, is
superseded: deleted, and the job's last_claim_id cleared, so that the old holder's writes
are refused and a report carrying that claim can never pass for a retry of its own. The
event names the superseded claim. The three differ only in the Transition they apply.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass

from django.db import transaction
from django.db.models import F, Q
from django.db.models.functions import Now

from jobqueue import observe, states, wakeups
from jobqueue.exceptions import InvalidTransition, JobFinished
from jobqueue.models import Job, JobClaim, JobEvent
from jobqueue.timeline import keep_said

from .finished import announce_finished
from .groups import hold_group, holding_group
from .records import event, fetch_job, scoped_jobs


@dataclass(frozen=True)
class Transition:
    allowed: Q  # the statuses it moves a job from
    changes: Callable[[str], dict]  # reason -> the job's new values
    kind: str  # the event it writes
    detail: Callable[[Job], dict]  # the event's detail beyond reason and superseded_claim
    observed: Callable[[Job], tuple[str, dict]]  # what it emits
    unchanged: Callable[[Job], Job]  # nothing changed: the answer, or raise
    wakes: Callable[[Job], str]  # the waits it may end (jobqueue.wakeups)
    revives: bool = False  # it makes a job live again: refused in a cancelled group


def _finished(job: Job) -> Job:
    raise JobFinished(f"The job is already {job.status}.")


def _not_pending(job: Job) -> Job:
    raise InvalidTransition("A pending job cannot be requeued; dispatch it instead.")


CANCEL = Transition(
    allowed=Q(status__in=states.ACTIVE),
    changes=lambda reason: {"status": states.CANCELLED, "completed_at": Now()},
    kind=JobEvent.CANCELLED,
    detail=lambda job: {},
    observed=lambda job: ("cancelled", {}),
    # Cancelling a cancelled job returns it unchanged.
    unchanged=lambda job: job if job.status == states.CANCELLED else _finished(job),
    wakes=lambda job: wakeups.job_key(job.id),
)
REQUEUE = Transition(
    allowed=~Q(status=states.PENDING),
    changes=lambda reason: {
        "status": states.QUEUED,
        "available_at": Now(),
        "completed_at": None,
        "max_attempts": F("attempt") + F("initial_max_attempts"),
    },
    kind=JobEvent.REQUEUED,
    detail=lambda job: {"max_attempts": job.max_attempts},
    observed=lambda job: ("requeued", {}),
    unchanged=_not_pending,
    wakes=wakeups.route_key,
    revives=True,
)
MARK_FAILED = Transition(
    allowed=Q(status__in=states.ACTIVE),
    changes=lambda reason: {
        "status": states.FAILURE,
        "completed_at": Now(),
        "message": (reason or "Marked failed by an operator.")[:2000],
    },
    kind=JobEvent.STATUS_REPORTED,
    detail=lambda job: {"status": states.FAILURE},
    observed=lambda job: ("reported", {"job_agent_id": job.job_agent_id,
                                       "status": states.FAILURE}),
    unchanged=_finished,
    wakes=lambda job: wakeups.job_key(job.id),
)


def apply(transition: Transition, job_id: uuid.UUID, *, actor: str = "", reason: str = "",
          workspace_id: uuid.UUID | None = None) -> Job:
    def once(reopen: bool):
        with transaction.atomic():
            if transition.revives:
                _hold_group_of(job_id, workspace_id, reopen=reopen)
            # The latest claim's `claimed` and a finished job's final report may be read
            # from its row (jobqueue/timeline.py), whose last_claim_id this clears.
            keep_said(scoped_jobs(workspace_id).filter(transition.allowed, id=job_id))
            n = (
                scoped_jobs(workspace_id)
                .filter(transition.allowed, id=job_id)
                .update(updated_at=Now(), last_claim_id=None, **transition.changes(reason))
            )
            if n != 1:
                # Nothing changed; nor may a reopened group's mark (it is still finished).
                transaction.set_rollback(True)
                return n, None
            superseded = _supersede_claim(job_id)
            job = Job.objects.get(id=job_id)
            event(job.id, transition.kind, attempt=job.attempt, actor=actor,
                  claim_id=superseded, reason=(reason or "")[:500],
                  superseded_claim=bool(superseded), **transition.detail(job)).save()
            wakeups.announce(transition.wakes(job))
            if job.status in states.TERMINAL:
                announce_finished([(job.id, job.workspace_id, job.status)], actor=actor)
            return n, job

    n, job = holding_group(once) if transition.revives else once(False)
    if n != 1:
        return transition.unchanged(fetch_job(job_id, workspace_id=workspace_id))
    kind, data = transition.observed(job)
    observe.emit(kind, **data)
    return job


def _hold_group_of(job_id: uuid.UUID, workspace_id: uuid.UUID | None, *,
                   reopen: bool) -> None:
    """A job's group (it never changes) stays uncancelled (and unfinished) until the caller
    commits, or GroupCancelled (GroupFinished: groups.holding_group)."""
    row = scoped_jobs(workspace_id).filter(id=job_id).values_list("workspace_id", "group").first()
    if row is not None and row[1] is not None:
        hold_group(row[0], row[1], create=False, reopen=reopen)


def _supersede_claim(job_id: uuid.UUID) -> uuid.UUID | None:
    """Remove the job's claim, if any, and return its claim_id. The caller has locked
    (updated) the job row and cleared last_claim_id there."""
    claim_id = JobClaim.objects.filter(job_id=job_id).values_list("claim_id", flat=True).first()
    if claim_id is not None:
        JobClaim.objects.filter(job_id=job_id).delete()
    return claim_id


def cancel_job(job_id: uuid.UUID, *, actor: str = "", reason: str = "",
               workspace_id: uuid.UUID | None = None) -> Job:
    """Any non-terminal job -> cancelled. Supersedes a live claim. Cancelling a cancelled
    job returns it unchanged; any other terminal job raises JobFinished."""
    return apply(CANCEL, job_id, actor=actor, reason=reason, workspace_id=workspace_id)


def requeue_job(job_id: uuid.UUID, *, actor: str = "", reason: str = "",
                workspace_id: uuid.UUID | None = None) -> Job:
    """Any non-pending job -> queued now, with as many further attempts as it was created
    with. Supersedes a live claim: the old holder's claim_id stops working. A job of a
    cancelled group is never requeued (GroupCancelled)."""
    return apply(REQUEUE, job_id, actor=actor, reason=reason, workspace_id=workspace_id)


def mark_failed(job_id: uuid.UUID, *, actor: str = "", reason: str = "",
                workspace_id: uuid.UUID | None = None) -> Job:
    """Any non-terminal job -> failure, superseding any claim."""
    return apply(MARK_FAILED, job_id, actor=actor, reason=reason, workspace_id=workspace_id)
