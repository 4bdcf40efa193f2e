"""Factories with a trait for each job state."""

import factory

from jobqueue import lifecycle, states
from jobqueue.models import Job, JobAgent, Workspace


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

    class Params:
        pending = factory.Trait(status=states.PENDING)


def claimed_job(**kwargs):
    """A job claimed through lifecycle.claim_job; returns (job, grant)."""
    job = JobFactory(**kwargs)
    grant = lifecycle.claim_job(job.job_agent, job.id)
    return grant.job, grant
