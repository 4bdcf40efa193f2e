"""group.finished: the group watcher marks a group finished once its last live job has ended
and writes one delivery per endpoint that wants it, in the same transaction; a create or a
requeue into a finished group makes it live again (and it finishes, and says so, again); a
mark is never made while a job of the group is live, under racing creators (PostgreSQL)."""

import importlib
import json
import threading

import pytest
from django.apps import apps
from django.core.management import CommandError, call_command

from jobqueue import lifecycle, states
from jobqueue.exceptions import GroupCancelled
from jobqueue.maintenance import group_watcher as watcher
from jobqueue.maintenance import webhooks
from jobqueue.models import Job, JobGroup, WebhookDelivery, WebhookEndpoint
from tests.factories import JobAgentFactory, WorkspaceFactory
from tests.utils import run_threads
from tests.webhook_receiver import Receiver

pytestmark = pytest.mark.django_db(transaction=True)
GROUP = WebhookEndpoint.GROUP_FINISHED


def create(agent, group="run-1", **kw):
    job, _ = lifecycle.create_job(workspace=agent.workspace, job_agent=agent, group=group, **kw)
    return job


def finish(job, status=states.SUCCESSFUL):
    grant = lifecycle.claim_job(job.job_agent, job.id)
    lifecycle.report_status(job.id, grant.claim_id, status)


def group_deliveries(**kw):
    return list(WebhookDelivery.objects.filter(event=GROUP, **kw).order_by("created_at"))


def endpoint(workspace, events=()):
    return webhooks.create_endpoint(workspace.id, "http://127.0.0.1:9/hook", list(events))[0]


def test_a_group_finishes_once_when_its_last_live_job_ends():
    agent = JobAgentFactory(max_attempts=1)
    wants_all, wants_groups = endpoint(agent.workspace), endpoint(agent.workspace, [GROUP])
    endpoint(agent.workspace, ["job.finished"])  # wants no group event
    endpoint(WorkspaceFactory())  # another workspace's
    jobs = [create(agent) for _ in range(3)]
    other = create(agent, group="run-2")  # another group, still live
    finish(jobs[0])
    finish(jobs[1], states.FAILURE)
    assert watcher.run_once() == {"finished": 0, "cancelled": 0}
    assert not group_deliveries()
    lifecycle.cancel_job(jobs[2].id)
    assert watcher.run_once() == {"finished": 1, "cancelled": 0}
    sent = group_deliveries()
    assert {d.endpoint_id for d in sent} == {wants_all.id, wants_groups.id}
    group = JobGroup.objects.get(workspace=agent.workspace, name="run-1")
    assert group.finished_at is not None
    for d in sent:
        assert (d.group_id, d.job_id, d.status) == (group.id, None, WebhookDelivery.PENDING)
        assert d.payload == {
            "id": str(d.id), "event": GROUP,
            "created_at": d.created_at.isoformat().replace("+00:00", "Z"),
            "group": {"group": "run-1", "finished": True, "cancelled_at": None,
                      "counts": {**dict.fromkeys(states.ALL, 0), states.SUCCESSFUL: 1,
                                 states.FAILURE: 1, states.CANCELLED: 1}},
        }
        assert d.created_at == group.finished_at
    assert watcher.run_once() == {"finished": 0, "cancelled": 0}  # once
    assert len(group_deliveries()) == 2
    assert JobGroup.objects.get(name="run-2").finished_at is None
    assert Job.objects.get(id=other.id).status == states.QUEUED


def test_a_cancelled_group_finishes_with_its_cancel():
    agent = JobAgentFactory()
    endpoint(agent.workspace)
    running = create(agent)
    lifecycle.claim_job(agent, running.id)
    create(agent)
    assert lifecycle.cancel_group(agent.workspace_id, "run-1", reason="stop") == 2
    assert watcher.run_once() == {"finished": 1, "cancelled": 1}
    (d,) = group_deliveries()
    assert d.payload["group"]["counts"][states.CANCELLED] == 2
    assert d.payload["group"]["cancelled_at"].endswith("Z")


def test_a_create_into_a_finished_group_makes_it_live_and_it_finishes_again():
    agent = JobAgentFactory(max_attempts=1)
    endpoint(agent.workspace)
    finish(create(agent))
    assert watcher.run_once()["finished"] == 1
    late = create(agent)  # the group was marked finished: the create reopens it
    assert JobGroup.objects.get(name="run-1").finished_at is None
    assert watcher.run_once()["finished"] == 0
    finish(late)
    assert watcher.run_once()["finished"] == 1
    first, second = group_deliveries()
    assert first.payload["group"]["counts"][states.SUCCESSFUL] == 1
    assert second.payload["group"]["counts"][states.SUCCESSFUL] == 2


def test_a_requeue_reopens_a_finished_group_and_a_cancelled_group_stays_finished():
    agent = JobAgentFactory(max_attempts=1)
    endpoint(agent.workspace)
    job = create(agent)
    finish(job, states.FAILURE)
    watcher.run_once()
    lifecycle.requeue_job(job.id)
    assert JobGroup.objects.get(name="run-1").finished_at is None
    finish(Job.objects.get(id=job.id))
    assert watcher.run_once()["finished"] == 1
    assert len(group_deliveries()) == 2
    lifecycle.cancel_group(agent.workspace_id, "run-1")
    marked = JobGroup.objects.get(name="run-1").finished_at
    with pytest.raises(GroupCancelled):
        lifecycle.requeue_job(job.id)
    with pytest.raises(GroupCancelled):
        create(agent)
    assert JobGroup.objects.get(name="run-1").finished_at == marked  # not reopened
    assert watcher.run_once()["finished"] == 0


def test_the_sender_signs_and_posts_a_group_delivery():
    agent = JobAgentFactory(max_attempts=1)
    receiver = Receiver()
    try:
        ep, secret = webhooks.create_endpoint(agent.workspace_id, receiver.url, [GROUP])
        finish(create(agent))
        watcher.run_once()
        assert webhooks.run_once()["delivered"] == 1
        (request,) = receiver.requests
    finally:
        receiver.close()
    (d,) = group_deliveries(endpoint=ep)
    assert request["headers"]["X-Jobqueue-Event"] == GROUP
    assert request["headers"]["X-Jobqueue-Delivery"] == str(d.id)
    body = json.loads(request["body"])
    assert body["group"]["group"] == "run-1" and body["group"]["finished"] is True
    t = request["headers"]["X-Jobqueue-Signature"].split(",")[0][2:]
    assert request["headers"]["X-Jobqueue-Signature"] == webhooks.sign(secret, int(t),
                                                                        request["body"])


def test_watch_groups_command_and_batches(capsys):
    agent = JobAgentFactory(max_attempts=1)
    for i in range(5):
        finish(create(agent, group=f"g{i}"))
    create(agent, group="live")
    call_command("watch_groups", "--batch-size", "2", "--json")
    assert json.loads(capsys.readouterr().out) == {"finished": 5, "cancelled": 0}
    call_command("watch_groups")
    assert capsys.readouterr().out.strip() == "finished 0, cancelled 0"
    assert set(JobGroup.objects.filter(finished_at__isnull=True).values_list(
        "name", flat=True)) == {"live"}
    with pytest.raises(CommandError, match="--batch-size must be at least 1"):
        call_command("watch_groups", "--batch-size", "0")


def test_the_migration_marks_groups_already_finished_without_a_delivery():
    agent = JobAgentFactory(max_attempts=1)
    endpoint(agent.workspace)
    finish(create(agent, group="done"))
    create(agent, group="live")
    migration = importlib.import_module("jobqueue.migrations.0011_group_finished")
    migration.mark_finished_groups(apps, None)
    assert set(JobGroup.objects.filter(finished_at__isnull=False).values_list(
        "name", flat=True)) == {"done"}
    assert watcher.run_once()["finished"] == 0
    assert not group_deliveries()


@pytest.mark.postgres_only
def test_no_group_is_marked_finished_while_one_of_its_jobs_is_live():
    """Creators add a job to one group, check the group is not marked while their job is live,
    then end it; watchers mark it whenever it is empty. Without the reopen protocol a create
    that waits behind a watcher's mark would leave the mark on a live group."""
    agent = JobAgentFactory(max_attempts=1)
    endpoint(agent.workspace, [GROUP])
    lifecycle.cancel_job(create(agent, group="hot").id)
    stop = threading.Event()
    rounds = 60

    def creator(i, barrier):
        barrier.wait()
        wrong = 0
        for _ in range(rounds):
            job = create(agent, group="hot")
            if JobGroup.objects.get(name="hot").finished_at is not None:
                wrong += 1
            lifecycle.cancel_job(job.id)
        return wrong

    def watching(i, barrier):
        barrier.wait()
        marked = 0
        while not stop.is_set():
            marked += len(lifecycle.mark_finished_groups(10))
        return marked

    creators = 3
    finished_creators = []

    def run(i, barrier):
        if i >= creators:
            return "watcher", watching(i, barrier)
        try:
            return "creator", creator(i, barrier)
        finally:
            finished_creators.append(i)
            if len(finished_creators) == creators:
                stop.set()

    results = run_threads(run, creators + 2)
    assert [n for kind, n in results if kind == "creator"] == [0, 0, 0]
    marked = sum(n for kind, n in results if kind == "watcher")
    marked += len(lifecycle.mark_finished_groups(10))
    assert marked >= 1
    assert not Job.objects.filter(status__in=states.ACTIVE).exists()
    assert JobGroup.objects.get(name="hot").finished_at is not None
    # One delivery per time it was marked, each telling a finished group.
    sent = group_deliveries()
    assert len(sent) == marked
    assert all(d.payload["group"]["finished"] for d in sent)


@pytest.mark.postgres_only
def test_concurrent_watchers_mark_each_group_once():
    agent = JobAgentFactory(max_attempts=1)
    endpoint(agent.workspace, [GROUP])
    for i in range(60):
        lifecycle.cancel_job(create(agent, group=f"g{i}").id)

    def watch(i, barrier):
        barrier.wait()
        return [g.group for g in lifecycle.mark_finished_groups(7)]

    marked = [name for names in run_threads(watch, 4) for name in names]
    assert sorted(marked) == sorted(f"g{i}" for i in range(60))  # each once, by one watcher
    assert len(group_deliveries()) == 60
    assert not JobGroup.objects.filter(finished_at__isnull=True).exists()


def test_groups_of_two_workspaces_finish_in_one_sweep_each_with_its_own_counts():
    """Workspace A's live group shares its name with B's finished one: B's counts and
    deliveries are B's alone, and A's endpoint hears only of A's group."""
    a, b = JobAgentFactory(max_attempts=1), JobAgentFactory(max_attempts=1)
    hook_a, hook_b = endpoint(a.workspace, [GROUP]), endpoint(b.workspace, [GROUP])
    finish(create(a, group="done"))
    create(a, group="shared")  # live: A's "shared" does not finish
    create(a, group="shared")
    finish(create(b, group="shared"), states.FAILURE)
    assert watcher.run_once() == {"finished": 2, "cancelled": 0}
    sent = {d.endpoint_id: d.payload["group"] for d in group_deliveries()}
    assert set(sent) == {hook_a.id, hook_b.id}
    assert sent[hook_a.id]["group"] == "done"
    assert sent[hook_b.id] == {"group": "shared", "finished": True, "cancelled_at": None,
                               "counts": {**dict.fromkeys(states.ALL, 0), states.FAILURE: 1}}
