"""Factories with a trait for each job state.

`JobFactory()` inserts a queued job. Each trait reaches its state through the lifecycle's
own transitions, never by writing the status:

    JobFactory(pending=True)      lifecycle.create_job(hold=True)
    JobFactory(in_progress=True)  claim_job (also `claimed=True`)
    JobFactory(successful=True)   claim_job, report_status(successful)
    JobFactory(failure=True)      claim_job, report_status(failure)
    JobFactory(cancelled=True)    cancel_job
    JobFactory(expired=True)      claim_job on the last attempt (max_attempts 1), the lease
                                  run out, reap_expired_claims_once (which reaps every
                                  lease that has run out, as the reaper does)

The job returned is read back after its transitions. `claimed_job()` also returns the claim.
"""

import factory

from jobqueue import lifecycle, states
from jobqueue.db import NowPlusSeconds
from jobqueue.models import Job, JobAgent, JobClaim, Workspace


class WorkspaceFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Workspace

    name = factory.Sequence(lambda n: f"workspace-{n}")


class JobAgentFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = JobAgent

    workspace = factory.SubFactory(WorkspaceFactory)
    name = factory.Sequence(lambda n: f"agent-{n}")
    lease_seconds = 60
    max_attempts = 3


# What lifecycle.create_job takes besides the workspace and the agent (the pending trait).
_CREATE_ARGS = frozenset({
    "job_agent_config", "dispatch_context", "priority", "max_attempts", "retry_backoff_seconds",
    "max_runtime_seconds", "expires_at", "external_id", "idempotency_key", "group",
    "unique_key",
})


def _create_pending(fields: dict) -> Job:
    """A pending job as a producer makes one: create_job(hold=True)."""
    fields = dict(fields)
    fields.pop("status", None)
    fields.pop("initial_max_attempts", None)  # create_job sets it from max_attempts
    workspace, job_agent = fields.pop("workspace"), fields.pop("job_agent")
    unknown = set(fields) - _CREATE_ARGS
    if unknown:
        raise TypeError(f"the pending trait creates through lifecycle.create_job, which does "
                        f"not take {sorted(unknown)}")
    job, _created = lifecycle.create_job(workspace=workspace, job_agent=job_agent, hold=True,
                                         **fields)
    return job


def reach(job: Job, state: str) -> Job:
    """Move a queued `job` to `state` through the lifecycle; returns it as it now is."""
    if state == states.QUEUED:
        return job
    if state == states.EXPIRED and job.attempt + 1 < job.max_attempts:
        raise ValueError("a lease that runs out on an attempt that is not the last requeues "
                         "the job: give it max_attempts=1")
    if state == states.CANCELLED:
        lifecycle.cancel_job(job.id)
    else:
        grant = lifecycle.claim_job(job.job_agent, job.id)
        if state in (states.SUCCESSFUL, states.FAILURE):
            lifecycle.report_status(job.id, grant.claim_id, state)
        elif state == states.EXPIRED:
            JobClaim.objects.filter(job_id=job.id).update(claim_expires_at=NowPlusSeconds(-1))
            lifecycle.reap_expired_claims_once(batch_size=1000)
        elif state != states.IN_PROGRESS:
            raise ValueError(f"no trait reaches {state!r}")
    job.refresh_from_db()
    assert job.status == state, (job.status, state)
    return job


class JobFactory(factory.django.DjangoModelFactory):
    """Inserts a queued job. Traits move it through the real lifecycle functions."""

    class Meta:
        model = Job

    job_agent = factory.SubFactory(JobAgentFactory)
    workspace = factory.SelfAttribute("job_agent.workspace")
    status = states.QUEUED
    job_agent_config = factory.LazyFunction(lambda: {"command": ["true"]})
    dispatch_context = factory.LazyFunction(dict)
    max_attempts = factory.SelfAttribute("job_agent.max_attempts")
    initial_max_attempts = factory.SelfAttribute("max_attempts")
    # Not a field: the state the traits reach (taken out before the insert, see _create).
    lifecycle_state = states.QUEUED

    class Params:
        pending = factory.Trait(lifecycle_state=states.PENDING)
        in_progress = factory.Trait(lifecycle_state=states.IN_PROGRESS)
        claimed = factory.Trait(lifecycle_state=states.IN_PROGRESS)
        successful = factory.Trait(lifecycle_state=states.SUCCESSFUL)
        failure = factory.Trait(lifecycle_state=states.FAILURE)
        cancelled = factory.Trait(lifecycle_state=states.CANCELLED)
        expired = factory.Trait(lifecycle_state=states.EXPIRED, max_attempts=1)

    @classmethod
    def _create(cls, model_class, *args, lifecycle_state=states.QUEUED, **kwargs):
        if lifecycle_state == states.PENDING:
            return _create_pending(kwargs)
        job = super()._create(model_class, *args, **kwargs)
        return reach(job, lifecycle_state)

    @classmethod
    def _build(cls, model_class, *args, lifecycle_state=states.QUEUED, **kwargs):
        if lifecycle_state != states.QUEUED:
            raise TypeError("a job reaches a state through the lifecycle: create it, not build")
        return super()._build(model_class, *args, **kwargs)


def claimed_job(**kwargs):
    """A job claimed through lifecycle.claim_job; returns (job, grant)."""
    job = JobFactory(**kwargs)
    grant = lifecycle.claim_job(job.job_agent, job.id)
    return grant.job, grant
