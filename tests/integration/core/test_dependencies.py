"""Dependencies between jobs (#30 item 2; docs/api.md "Dependencies and flows"): a dependent
waits pending until every parent is successful, then is queued in the transition that made
the last one successful (single report, batch report); when a parent ends otherwise (report,
batch report, reaper, the clocks, cancel, mark failed, group cancel) it ends cancelled
(dependency_failed) down the graph, never to be revived. Both databases."""

import datetime as dt

import pytest
from django.db import connection

from jobqueue import lifecycle, states
from jobqueue.db import NowPlusSeconds, db_now
from jobqueue.exceptions import InvalidInput, InvalidTransition
from jobqueue.lifecycle import dependencies
from jobqueue.models import (
    Job,
    JobClaim,
    JobDependency,
    JobEvent,
    WebhookDelivery,
    WebhookEndpoint,
)
from tests.factories import JobAgentFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _create(agent, **fields):
    return lifecycle.create_job(workspace=agent.workspace, job_agent=agent, **fields).job


def _run(agent, job, status=states.SUCCESSFUL, **fields):
    """Claim `job` (it must be the next claimable) and report `status`."""
    grant = lifecycle.claim_job(agent, job.id)
    return lifecycle.report_status(job.id, grant.claim_id, status, **fields)


def _status(job):
    return Job.objects.values_list("status", flat=True).get(id=job.id)


@pytest.fixture
def agent():
    return JobAgentFactory(max_attempts=1)


def test_a_dependent_waits_until_every_parent_succeeded(agent):
    a, b = _create(agent), _create(agent)
    child = _create(agent, depends_on=[a.id, b.id, a.id], dispatch_context={"n": 1})
    assert child.status == states.PENDING and child.has_parents
    assert dependencies.waiting_on(child) == sorted([a.id, b.id])
    assert Job.objects.filter(id__in=[a.id, b.id], has_dependents=True).count() == 2
    assert JobDependency.objects.filter(child=child).count() == 2  # a repeat counts once
    assert str(JobDependency.objects.get(child=child, parent=a)) == f"{child.id} after {a.id}"
    with pytest.raises(InvalidTransition):  # its producer cannot queue it early
        lifecycle.dispatch_job(child.id)
    _run(agent, a, result={"rows": 3})
    child = Job.objects.get(id=child.id)
    assert child.status == states.PENDING
    assert dependencies.waiting_on(child) == [b.id]
    _run(agent, b)
    child = Job.objects.get(id=child.id)
    assert child.status == states.QUEUED and dependencies.waiting_on(child) == []
    released = child.events.get(kind=JobEvent.DISPATCHED)
    assert released.detail == {"dependencies": "successful", "parent": str(b.id)}
    grant = lifecycle.claim_job(agent, child.id)
    assert grant.parents == sorted([
        {"job_id": a.id, "status": "successful", "result": {"rows": 3}},
        {"job_id": b.id, "status": "successful", "result": None}],
        key=lambda p: p["job_id"])


def test_a_plain_claim_carries_no_parents(agent):
    job = _create(agent)
    assert lifecycle.claim_job(agent, job.id).parents == []
    assert dependencies.parents(job) == [] and dependencies.waiting_on(job) == []


def test_a_batch_report_that_ends_every_parent_releases_the_child_once(agent):
    parents = [_create(agent) for _ in range(3)]
    child = _create(agent, depends_on=[p.id for p in parents])
    grants = lifecycle.claim_next_jobs(agent, 3)
    done = lifecycle.report_many(agent.id, [
        lifecycle.ReportItem(g.job.id, g.claim_id, states.SUCCESSFUL) for g in grants])
    assert all(r.accepted for r in done.results)
    assert _status(child) == states.QUEUED
    assert child.events.filter(kind=JobEvent.DISPATCHED).count() == 1


def test_parents_already_successful_count_as_done(agent):
    a = _create(agent)
    _run(agent, a)
    child = _create(agent, depends_on=[a.id])
    assert child.status == states.QUEUED and child.has_parents
    assert lifecycle.claim_next_job(agent).parents[0]["job_id"] == a.id


@pytest.mark.parametrize("end", ["failure", "cancelled"])
def test_a_parent_that_already_failed_cancels_the_new_dependent(agent, end):
    a = _create(agent)
    if end == "failure":
        _run(agent, a, states.FAILURE)
    else:
        lifecycle.cancel_job(a.id)
    child = _create(agent, depends_on=[a.id])
    assert child.status == states.CANCELLED and child.completed_at is not None
    assert child.message == f"dependency_failed: {a.id}"


@pytest.mark.parametrize("path", ["report", "batch", "cancel", "mark_failed", "group",
                                  "reaper", "overdue"])
def test_a_parent_that_ends_otherwise_cancels_its_dependents_down_the_graph(agent, path):
    WebhookEndpoint.objects.create(workspace=agent.workspace, url="http://hook.test/",
                                   secret="s" * 32)
    parent = _create(agent, group="run-1")
    sibling = _create(agent)
    child = _create(agent, depends_on=[parent.id, sibling.id])
    grandchild = _create(agent, depends_on=[child.id])
    lifecycle.wait_for_job_end(grandchild.id, 0)  # a producer watches it
    if path in ("report", "batch", "reaper"):
        grant = lifecycle.claim_job(agent, parent.id)
        if path == "report":
            lifecycle.report_status(parent.id, grant.claim_id, states.FAILURE)
        elif path == "batch":
            lifecycle.report_many(agent.id, [
                lifecycle.ReportItem(parent.id, grant.claim_id, states.CANCELLED)])
        else:
            JobClaim.objects.filter(job_id=parent.id).update(
                claim_expires_at=NowPlusSeconds(-1))
            assert lifecycle.reap_expired_claims_once(10).expired == 1
    elif path == "cancel":
        lifecycle.cancel_job(parent.id)
    elif path == "mark_failed":
        lifecycle.mark_failed(parent.id)
    elif path == "group":
        assert lifecycle.cancel_group(agent.workspace_id, "run-1") == 1
    else:
        Job.objects.filter(id=parent.id).update(expires_at=NowPlusSeconds(-1))
        assert lifecycle.expire_overdue_jobs_once(10).expired == 1
    for job, named in ((child, parent), (grandchild, child)):
        job.refresh_from_db()
        assert job.status == states.CANCELLED, path
        assert job.message == f"dependency_failed: {named.id}"
        assert job.events.get(kind=JobEvent.CANCELLED).detail == {
            "reason": "dependency_failed", "parent": str(named.id)}
        assert WebhookDelivery.objects.filter(job_id=job.id).count() == 1
    assert _status(sibling) == states.QUEUED  # a parent is not a dependent
    # Never revived: the parent requeued and successful finds them ended (a cancelled
    # group takes no requeue: its parent is requeued out of the group).
    if path in ("group", "overdue"):
        Job.objects.filter(id=parent.id).update(group=None, expires_at=None)
    lifecycle.requeue_job(parent.id)
    _run(agent, Job.objects.get(id=parent.id))
    assert _status(child) == _status(grandchild) == states.CANCELLED


def test_a_retryable_failure_of_a_parent_settles_nothing():
    agent = JobAgentFactory(max_attempts=3)
    parent = _create(agent)
    child = _create(agent, depends_on=[parent.id])
    grant = lifecycle.claim_job(agent, parent.id)
    lifecycle.report_status(parent.id, grant.claim_id, states.FAILURE, retry=True)
    assert _status(parent) == states.QUEUED and _status(child) == states.PENDING
    lifecycle.requeue_job(parent.id)  # past its backoff: run it now
    _run(agent, Job.objects.get(id=parent.id))
    assert _status(child) == states.QUEUED


def test_a_batch_retry_of_a_parent_settles_nothing():
    agent = JobAgentFactory(max_attempts=3)
    parent = _create(agent)
    child = _create(agent, depends_on=[parent.id])
    grant = lifecycle.claim_job(agent, parent.id)
    lifecycle.report_many(agent.id, [lifecycle.ReportItem(parent.id, grant.claim_id,
                                                          states.FAILURE, retry=True)])
    assert _status(parent) == states.QUEUED and _status(child) == states.PENDING


def test_a_released_child_is_not_cancelled_by_a_later_failure_of_its_parent(agent):
    parent = _create(agent)
    child = _create(agent, depends_on=[parent.id])
    _run(agent, parent)
    assert _status(child) == states.QUEUED
    lifecycle.requeue_job(parent.id)
    _run(agent, Job.objects.get(id=parent.id), states.FAILURE)
    assert _status(child) == states.QUEUED


def test_a_requeued_parent_must_succeed_again(agent):
    a, b = _create(agent), _create(agent)
    child = _create(agent, depends_on=[a.id, b.id])
    _run(agent, a)
    lifecycle.requeue_job(a.id)
    _run(agent, b)
    assert _status(child) == states.PENDING
    _run(agent, Job.objects.get(id=a.id))
    assert _status(child) == states.QUEUED


@pytest.mark.parametrize("depends_on", [[], ["nope"], [None], list(range(101))])
def test_bad_dependencies_are_refused_naming_the_field(agent, depends_on):
    with pytest.raises(InvalidInput) as exc:
        _create(agent, depends_on=depends_on)
    assert exc.value.context["field"] == "depends_on"
    assert Job.objects.count() == 0


def test_an_unknown_or_foreign_parent_is_refused_and_nothing_is_created(agent):
    import uuid

    foreign = _create(JobAgentFactory())
    mine = _create(agent)
    for missing in (uuid.uuid4(), foreign.id):
        with pytest.raises(InvalidInput) as exc:
            _create(agent, depends_on=[mine.id, missing])
        assert exc.value.context["field"] == "depends_on"
    assert Job.objects.count() == 2
    assert not Job.objects.filter(has_dependents=True).exists()
    assert not JobDependency.objects.exists()


def test_hold_and_dependencies_do_not_mix(agent):
    parent = _create(agent)
    with pytest.raises(InvalidInput) as exc:
        _create(agent, depends_on=[parent.id], hold=True)
    assert exc.value.context["field"] == "depends_on"


def test_a_pending_dependent_can_be_cancelled_and_cascades(agent):
    parent = _create(agent)
    child = _create(agent, depends_on=[parent.id])
    grandchild = _create(agent, depends_on=[child.id])
    lifecycle.cancel_job(child.id)
    assert _status(grandchild) == states.CANCELLED
    _run(agent, parent)  # its success finds nothing pending
    assert _status(child) == states.CANCELLED


def test_a_flow_creates_its_graph_at_once(agent):
    other = JobAgentFactory(workspace=agent.workspace)
    outside = _create(agent)
    made = lifecycle.create_flow(workspace=agent.workspace, jobs=[
        lifecycle.FlowJob(ref="extract", job_agent=agent, dispatch_context={"day": 1}),
        lifecycle.FlowJob(ref="load", job_agent=other, depends_on_refs=["extract"],
                          depends_on=[str(outside.id)], delay_seconds=5, group="run",
                          expires_at=db_now() + dt.timedelta(hours=1)),
    ])
    assert list(made) == ["extract", "load"]
    assert made["extract"].status == states.QUEUED and made["extract"].has_dependents
    assert made["load"].status == states.PENDING
    assert dependencies.waiting_on(made["load"]) == sorted([made["extract"].id, outside.id])
    _run(agent, made["extract"], result={"file": "x.csv"})
    _run(agent, outside)
    load = Job.objects.get(id=made["load"].id)
    assert load.status == states.QUEUED and load.group == "run"


def test_a_flow_under_a_failed_parent_starts_cancelled(agent):
    outside = _create(agent)
    lifecycle.cancel_job(outside.id)
    made = lifecycle.create_flow(workspace=agent.workspace, jobs=[
        lifecycle.FlowJob(ref="a", job_agent=agent, depends_on=[outside.id]),
        lifecycle.FlowJob(ref="b", job_agent=agent, depends_on_refs=["a"]),
        lifecycle.FlowJob(ref="c", job_agent=agent),
    ])
    assert [j.status for j in made.values()] == [states.CANCELLED, states.CANCELLED,
                                                  states.QUEUED]
    assert made["b"].message == f"dependency_failed: {made['a'].id}"


@pytest.mark.parametrize(("jobs", "field"), [
    ([], "jobs"),
    ([{"ref": "a"}, {"ref": "a"}], "jobs[1].ref"),
    ([{"ref": ""}], "jobs[0].ref"),
    ([{"ref": "a", "depends_on_refs": ["b"]}, {"ref": "b"}], "jobs[0].depends_on_refs"),
    ([{"ref": "a", "depends_on_refs": ["a"]}], "jobs[0].depends_on_refs"),
    ([{"ref": "a"}, {"ref": "b", "max_attempts": 0}], "jobs[1].max_attempts"),
    ([{"ref": "a"}, {"ref": "b", "depends_on": ["x"]}], "jobs[1].depends_on"),
    ([{"ref": "a"}, {"ref": "b", "depends_on_refs": ["a"],
                     "depends_on": [str(i) * 32 for i in range(10)] * 10}],
     "jobs[1].depends_on_refs"),
    ([{"ref": "a", "expires_at": "past"}], "jobs[0].expires_at"),
])
def test_a_bad_flow_is_refused_naming_the_job_and_creates_nothing(agent, jobs, field):
    items = []
    for item in jobs:
        item = dict(item)
        if item.get("expires_at") == "past":
            item["expires_at"] = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
        if "depends_on" in item and item["depends_on"] != ["x"]:
            item["depends_on"] = [f"{i:032x}" for i in range(len(item["depends_on"]))]
        items.append(lifecycle.FlowJob(job_agent=agent, **item))
    with pytest.raises(InvalidInput) as exc:
        lifecycle.create_flow(workspace=agent.workspace, jobs=items)
    assert exc.value.context["field"] == field
    assert Job.objects.count() == 0


def test_a_flow_with_an_unknown_or_foreign_parent_creates_nothing(agent):
    foreign = _create(JobAgentFactory())
    with pytest.raises(InvalidInput) as exc:
        lifecycle.create_flow(workspace=agent.workspace, jobs=[
            lifecycle.FlowJob(ref="a", job_agent=agent),
            lifecycle.FlowJob(ref="b", job_agent=agent, depends_on=[foreign.id])])
    assert exc.value.context["field"] == "jobs[1].depends_on"
    with pytest.raises(InvalidInput) as exc:
        lifecycle.create_flow(workspace=agent.workspace, jobs=[
            lifecycle.FlowJob(ref="a", job_agent=foreign.job_agent)])
    assert exc.value.context["field"] == "jobs[0].job_agent_id"
    assert Job.objects.count() == 1


def test_a_flow_of_a_thousand_jobs_is_one_transaction(agent, django_assert_max_num_queries):
    import time

    jobs = [lifecycle.FlowJob(ref="root", job_agent=agent)]
    jobs += [lifecycle.FlowJob(
        ref=f"j{i}", job_agent=agent,
        depends_on_refs=["root"] if i % 2 or not i else [f"j{i - 1}", "root"])
        for i in range(999)]
    started = time.monotonic()
    # One INSERT per table on PostgreSQL; SQLite splits them by its variable limit (more
    # statements as the job row gains columns: 63 with the flow-control columns of #29).
    with django_assert_max_num_queries(20 if connection.vendor == "postgresql" else 80):
        made = lifecycle.create_flow(workspace=agent.workspace, jobs=jobs)
    took = time.monotonic() - started
    print(f"\nflow of 1,000 jobs created in {took:.3f} s")
    assert len(made) == 1000 and Job.objects.count() == 1000
    assert JobDependency.objects.count() == 500 + 2 * 499
    assert Job.objects.filter(status=states.QUEUED).count() == 1
    _run(agent, made["root"])
    assert Job.objects.filter(status=states.QUEUED).count() == 500  # the odd ones


def test_a_fan_in_of_a_thousand_parents_releases_its_child_once(agent):
    """A create takes at most 100 dependencies: the other 900 edges are written here as a
    graph made of layers would hold them. Each batch report settles the one child (one row
    locked per report), and only the last parent's releases it."""
    made = lifecycle.create_flow(workspace=agent.workspace, jobs=[
        lifecycle.FlowJob(ref=f"p{i}", job_agent=agent) for i in range(1000)])
    parents = [job.id for job in made.values()]
    child = _create(agent, depends_on=parents[:100])
    JobDependency.objects.bulk_create(
        [JobDependency(child_id=child.id, parent_id=p) for p in parents[100:]])
    Job.objects.filter(id__in=parents).update(has_dependents=True)
    for _ in range(10):
        grants = lifecycle.claim_next_jobs(agent, 100)
        assert child.id not in {g.job.id for g in grants}
        assert _status(child) == states.PENDING
        lifecycle.report_many(agent.id, [
            lifecycle.ReportItem(g.job.id, g.claim_id, states.SUCCESSFUL) for g in grants])
    assert _status(child) == states.QUEUED
    assert child.events.filter(kind=JobEvent.DISPATCHED).count() == 1
    assert len(lifecycle.claim_job(agent, child.id).parents) == 1000
