"""Status reports: progress (in_progress) or a terminal status, one job or a batch.

Accepted with the current claim_id, even after the lease's expiry, as long as the reaper has
not taken the claim (nobody else can hold the job, and the claim row serializes the report
against the reaper). A terminal report ends the claim. A retried identical terminal report
(same claim_id, same status, and no field that differs from what the job kept) after a lost
answer is answered as accepted again; one with other content is 409 job_finished: its
content was not taken.
"""

from __future__ import annotations

import collections
import uuid
from collections.abc import Sequence

from django.db import transaction

from jobqueue import observe, states, wakeups
from jobqueue.actors import agent_actor
from jobqueue.exceptions import ClaimSuperseded, InvalidInput
from jobqueue.models import Job

from . import inputs
from .backends import backend
from .checkpoints import save_checkpoint
from .finished import announce_finished, announce_retrying
from .refusals import STATUS, Content, refuse, refuse_one
from .results import BatchReportResult, ReportOutcome


def report_status(
    job_id: uuid.UUID,
    claim_id: uuid.UUID,
    status: str,
    *,
    message: str | None = None,
    result=None,
    external_id: str | None = None,
    retry: bool = False,
    job_agent_id: uuid.UUID | None = None,
    workspace_id: uuid.UUID | None = None,
    checkpoint=None,
) -> Job:
    """Record progress (status in_progress) or end the job (a terminal status). None for
    message, result or external_id keeps the job's value. A progress report may carry a
    `checkpoint` (saved with it, under its guards, for the next attempt).

    `retry` (with status failure) is a retryable failure: while attempts remain the job goes
    back to queued, claimable after the backoff (docs/clocks.md); on the last attempt it
    ends failure. The answer is the job as it now is."""
    inputs.reportable_status(status)
    inputs.report_retry(status, retry)
    inputs.report_content(message, result)
    data = inputs.checkpoint(checkpoint)
    if data is not None and status != states.IN_PROGRESS:
        raise InvalidInput("Only a progress report (in_progress) carries a checkpoint.",
                           field="checkpoint")
    actor = agent_actor(job_agent_id) if job_agent_id else ""
    kwargs = {"message": message, "result": result, "external_id": external_id,
              "job_agent_id": job_agent_id, "workspace_id": workspace_id, "retry": retry}
    if data is None:
        job = backend().report(job_id, claim_id, status, actor, **kwargs)
    else:
        # The report first: it locks the job row, then the checkpoint the claim row (the
        # lifecycle's lock order). While the job row is held nobody can end the claim.
        with transaction.atomic():
            job = backend().report(job_id, claim_id, status, actor, **kwargs)
            if job is not None and not save_checkpoint(
                job_id, claim_id, data, job_agent_id=job_agent_id,
                workspace_id=workspace_id,
            ):  # pragma: no cover - impossible while the job row is locked
                raise ClaimSuperseded()
    if job is not None:
        if status == states.IN_PROGRESS:
            observe.emit("progress", job_agent_id=job.job_agent_id)
        else:
            if job.status in states.TERMINAL:
                _announce_ended([job.id])
                announce_finished([(job.id, job.workspace_id, job.status)], actor=actor,
                                  outbox_written=True)
            else:  # a retryable failure queued it again: claimable once its backoff ends
                _announce_retried([job], actor)
            observe.emit("reported", job_agent_id=job.job_agent_id, status=_counted(job.status))
        return job
    # Nothing changed: refused, or a retried terminal report after a lost answer.
    refuse_one(job_id, claim_id, STATUS, status=status,
               content=Content(message, result, external_id, retry), actor=actor,
               workspace_id=workspace_id, job_agent_id=job_agent_id)
    return Job.objects.get(id=job_id)


def report_many(job_agent_id: uuid.UUID, reports: Sequence[inputs.ReportItem], *,
                workspace_id: uuid.UUID | None = None) -> BatchReportResult:
    """End many jobs of one agent at once: `reports` is [ReportItem], each with a status
    that ends the job (successful, failure or cancelled).

    Every report whose claim is current is applied in one transaction (on PostgreSQL, one
    statement), with the single report's guards and events. Each other report is answered
    as the single report would: accepted when it repeats the job's final report (a retry
    after a lost answer: same claim, status and content), else job_cancelled,
    job_finished, claim_superseded or not_found;
    refusals are recorded like the single path's. Results keep the order of `reports`. A
    batch that breaks a rule (inputs.report_batch) changes nothing.
    """
    reports = inputs.report_batch(reports)
    actor = agent_actor(job_agent_id)
    done = backend().report_many(reports, job_agent_id, workspace_id, actor)
    announce_finished(((job_id, workspace, status) for job_id, (status, _at, workspace)
                       in done.items() if status in states.TERMINAL),
                      actor=actor, outbox_written=True)
    rest = [(r.job_id, r.claim_id, r.status,
             Content(r.message, r.result, r.external_id, r.retry))
            for r in reports if r.job_id not in done]
    codes, facts = {}, {}
    if rest:
        codes, facts = refuse(rest, STATUS, actor=actor, workspace_id=workspace_id,
                              job_agent_id=job_agent_id)
    _announce_ended([job_id for job_id, (status, _at, _ws) in done.items()
                     if status in states.TERMINAL])
    retried = [job_id for job_id, (status, _at, _ws) in done.items() if status == states.QUEUED]
    if retried:
        _announce_retried(Job.objects.filter(id__in=retried).only(
            "job_agent_id", "attempt", "available_at", "updated_at", "workspace_id",
            "label_set_id", "labels"), actor)
    counted = collections.Counter(_counted(status) for status, _at, _ws in done.values())
    for status, count in counted.items():  # one notification a status, not one a job
        observe.emit("reported", job_agent_id=job_agent_id, status=status, count=count)
    results = []
    for r in reports:
        if r.job_id in done:
            results.append(ReportOutcome(r.job_id, True, *done[r.job_id][:2]))
        elif codes[r.job_id] is None:  # a retry of the job's final report
            f = facts[r.job_id]
            results.append(ReportOutcome(r.job_id, True, f.status, f.completed_at))
        else:
            results.append(ReportOutcome(r.job_id, False, code=codes[r.job_id]))
    return BatchReportResult(results=results)


def _announce_ended(job_ids) -> None:
    """Wake the producers waiting for these jobs, unless the backend's report statements
    already did (PostgreSQL's, in the statement itself)."""
    if not backend().reports_announce_ended:
        wakeups.announce_many(wakeups.job_key(job_id) for job_id in job_ids)


def _announce_retried(jobs, actor: str) -> None:
    """job_retrying for these requeued jobs, and a wake-up for the agents' waiters when they
    become claimable: their backoff is available_at - updated_at, both set by the report's
    statement on the database's clock."""
    jobs = list(jobs)
    announce_retrying(jobs, actor=actor)
    for job in jobs:
        delay = max(0.0, (job.available_at - job.updated_at).total_seconds())
        wakeups.announce(wakeups.route_key(job), delay=delay)


def _counted(status: str) -> str:
    """The status a report is counted under: a retryable failure that queued the job again
    is "retrying"."""
    return "retrying" if status == states.QUEUED else status
