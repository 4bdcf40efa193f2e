"""Dependencies under races (#30 item 2), on PostgreSQL with real threads, each on its own
connection: parents that end at once release their child exactly once, a parent failing
while another succeeds never queues it, and a dependent created while its parent ends is
settled by that end (or sees it). jobqueue_settle_dependents locks the children before it
reads their parents (migration 0021); the create locks the parents (hold_parents)."""

import pytest

from jobqueue import lifecycle, states
from jobqueue.models import Job, JobEvent
from tests.factories import JobAgentFactory
from tests.utils import run_threads

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres_only]

ROUNDS = 8


def _create(agent, **fields):
    return lifecycle.create_job(workspace=agent.workspace, job_agent=agent, **fields).job


def _graph(agent, n):
    parents = [_create(agent) for _ in range(n)]
    child = _create(agent, depends_on=[p.id for p in parents])
    grants = {g.job.id: g for g in lifecycle.claim_next_jobs(agent, n)}
    return [grants[p.id] for p in parents], child


@pytest.mark.parametrize("batch", [False, True])
def test_parents_succeeding_at_once_release_the_child_exactly_once(batch):
    agent = JobAgentFactory(max_attempts=1)
    for _ in range(ROUNDS):
        grants, child = _graph(agent, 4)

        def report(i, barrier, grants=grants):
            g = grants[i]
            barrier.wait()
            if batch:
                lifecycle.report_many(agent.id, [
                    lifecycle.ReportItem(g.job.id, g.claim_id, states.SUCCESSFUL)])
            else:
                lifecycle.report_status(g.job.id, g.claim_id, states.SUCCESSFUL)

        run_threads(report, len(grants))
        child = Job.objects.get(id=child.id)
        assert child.status == states.QUEUED
        assert child.events.filter(kind=JobEvent.DISPATCHED).count() == 1
        lifecycle.cancel_job(child.id)


def test_a_parent_failing_while_another_succeeds_never_queues_the_child():
    agent = JobAgentFactory(max_attempts=1)
    for _ in range(ROUNDS):
        grants, child = _graph(agent, 2)
        grandchild = _create(agent, depends_on=[child.id])

        def report(i, barrier, grants=grants):
            g = grants[i]
            barrier.wait()
            status = states.SUCCESSFUL if i == 0 else states.FAILURE
            lifecycle.report_status(g.job.id, g.claim_id, status)

        run_threads(report, 2)
        child = Job.objects.get(id=child.id)
        assert child.status == states.CANCELLED
        assert child.message == f"dependency_failed: {grants[1].job.id}"
        assert not child.events.filter(kind=JobEvent.DISPATCHED).exists()
        assert Job.objects.get(id=grandchild.id).status == states.CANCELLED


@pytest.mark.parametrize("end", [states.SUCCESSFUL, states.FAILURE])
def test_a_dependent_created_while_its_parent_ends_is_settled(end):
    """The create locks the parent row and reads its status under the lock: either it sees
    the parent ended (and starts queued or cancelled), or the report waits for it and then
    settles it. Never a dependent left pending behind an ended parent."""
    agent = JobAgentFactory(max_attempts=1)
    for _ in range(ROUNDS):
        parent = _create(agent)
        grant = lifecycle.claim_job(agent, parent.id)
        made = []

        def work(i, barrier, parent=parent, grant=grant, made=made):
            barrier.wait()
            if i == 0:
                lifecycle.report_status(parent.id, grant.claim_id, end)
            else:
                made.append(_create(agent, depends_on=[parent.id]).id)

        run_threads(work, 2)
        child = Job.objects.get(id=made[0])
        assert child.status == (states.QUEUED if end == states.SUCCESSFUL
                                else states.CANCELLED)
        if child.status == states.QUEUED:
            lifecycle.cancel_job(child.id)


def test_racing_flows_on_one_parent_all_settle():
    """Many dependents created at once on one running parent (each create takes the parent's
    row lock in turn), then its end settles every one of them."""
    agent = JobAgentFactory(max_attempts=1)
    parent = _create(agent)
    grant = lifecycle.claim_job(agent, parent.id)

    def create(i, barrier):
        barrier.wait()
        return lifecycle.create_flow(workspace=agent.workspace, jobs=[
            lifecycle.FlowJob(ref="a", job_agent=agent, depends_on=[parent.id]),
            lifecycle.FlowJob(ref="b", job_agent=agent, depends_on_refs=["a"])])

    flows = run_threads(create, 6)
    lifecycle.report_status(parent.id, grant.claim_id, states.SUCCESSFUL)
    firsts = [flow["a"].id for flow in flows]
    assert set(Job.objects.filter(id__in=firsts).values_list("status", flat=True)) == {
        states.QUEUED}
