"""The factories' traits reach each job state through the lifecycle: the events a real job in
that state has, a claim exactly while it is in progress (invariant 2), never a status written
by hand."""

import pytest

from jobqueue import states
from jobqueue.models import Job, JobClaim, JobEvent
from tests.factories import JobAgentFactory, JobFactory, claimed_job
from tests.utils import final_state_is_consistent, timeline_events

pytestmark = pytest.mark.django_db

E = JobEvent
TRAITS = [
    ({}, states.QUEUED, []),
    ({"pending": True}, states.PENDING, [E.CREATED]),
    ({"in_progress": True}, states.IN_PROGRESS, [E.CLAIMED]),
    ({"claimed": True}, states.IN_PROGRESS, [E.CLAIMED]),
    ({"successful": True}, states.SUCCESSFUL, [E.CLAIMED, E.STATUS_REPORTED]),
    ({"failure": True}, states.FAILURE, [E.CLAIMED, E.STATUS_REPORTED]),
    ({"cancelled": True}, states.CANCELLED, [E.CANCELLED]),
    ({"expired": True}, states.EXPIRED, [E.CLAIMED, E.EXPIRED]),
]


@pytest.mark.parametrize(("trait", "status", "kinds"), TRAITS,
                         ids=[t[1] + ("-claimed" if "claimed" in t[0] else "") for t in TRAITS])
def test_each_trait_reaches_its_state_through_the_lifecycle(trait, status, kinds):
    job = JobFactory(**trait)
    assert job.status == status and Job.objects.get(id=job.id).status == status
    assert [e.kind for e in timeline_events(job.id)] == kinds
    assert JobClaim.objects.filter(job_id=job.id).exists() == (status == states.IN_PROGRESS)
    assert (job.completed_at is not None) == (status in states.TERMINAL)
    assert job.attempt == (1 if E.CLAIMED in kinds else 0)
    final_state_is_consistent()


def test_traits_keep_the_factorys_other_arguments():
    agent = JobAgentFactory()
    job = JobFactory(job_agent=agent, priority=7, dispatch_context={"k": 1}, successful=True)
    assert (job.job_agent_id, job.priority, job.dispatch_context) == (agent.id, 7, {"k": 1})
    pending = JobFactory(job_agent=agent, pending=True, priority=3)
    assert (pending.status, pending.priority, pending.workspace_id) == (
        states.PENDING, 3, agent.workspace_id)
    job, grant = claimed_job(job_agent=agent)
    assert job.status == states.IN_PROGRESS and grant.job.id == job.id


def test_a_trait_that_cannot_be_reached_so_says():
    with pytest.raises(ValueError, match="max_attempts=1"):
        JobFactory(expired=True, max_attempts=2)
    with pytest.raises(TypeError, match="create_job"):
        JobFactory(pending=True, attempt=2)
