"""What every transition reads and writes besides its own statement: the jobs a caller may
see, one job or NotFound, and the job events of the timeline."""

from __future__ import annotations

from jobqueue import states
from jobqueue.exceptions import NotFound
from jobqueue.models import Job, JobEvent


def scoped_jobs(workspace_id=None, job_agent_id=None):
    """The jobs a caller may act on: an agent's own, a workspace's, or (None) all."""
    qs = Job.objects.all()
    if workspace_id is not None:
        qs = qs.filter(workspace_id=workspace_id)
    if job_agent_id is not None:
        qs = qs.filter(job_agent_id=job_agent_id)
    return qs


def agent_jobs(workspace_id, job_agent_id, status=None):
    """An agent's jobs (those it targets or, a labelled job, claimed last), of one status or
    of every status. The workspace and the statuses are named so that job_workspace_status_idx
    (workspace, status, job_agent) serves the read: job_agent_id has no index of its own
    (migration 0036; an index entry fewer on each version of a job's row). Naming every status
    changes nothing that is returned (job_status_valid)."""
    return Job.objects.filter(workspace_id=workspace_id,
                              status__in=[status] if status else sorted(states.ALL),
                              job_agent_id=job_agent_id)


def seen_jobs(workspace_id=None, job_agent_id=None):
    """scoped_jobs, and for an agent also the labelled jobs routed to it (those its labels
    match): the jobs whose refusals and claim checks it is told about (409, not 404). A
    labelled job another agent claimed since names that agent, not this one; one query more,
    on these rare paths only."""
    from django.db.models import Q

    from jobqueue import claimrule
    from jobqueue.models import JobAgent

    if job_agent_id is None:
        return scoped_jobs(workspace_id)
    agent = JobAgent.objects.filter(id=job_agent_id).only("id", "workspace_id", "labels").first()
    if agent is None:  # pragma: no cover -- a deleted agent's tokens go with it
        return scoped_jobs(workspace_id, job_agent_id)
    routed = claimrule.routed_to(agent)
    return scoped_jobs(workspace_id).filter(Q(job_agent_id=job_agent_id) | routed)


def fetch_job(job_id, *, workspace_id=None, job_agent_id=None) -> Job:
    try:
        return scoped_jobs(workspace_id, job_agent_id).get(id=job_id)
    except Job.DoesNotExist as exc:
        raise NotFound("No such job.") from exc


def event(job_id, kind, *, attempt=0, actor="", claim_id=None, **detail) -> JobEvent:
    """A timeline entry (unsaved). `detail` never holds dispatch_context, results or tokens."""
    return JobEvent(
        job_id=job_id, kind=kind, attempt=attempt, actor=actor, claim_id=claim_id, detail=detail
    )
