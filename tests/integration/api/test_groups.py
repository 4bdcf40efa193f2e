"""Groups over HTTP: the group field, the filter, GET groups/{group}, the group's cancel and
the cancelled mark (409 group_cancelled on a create into it and on a requeue of its jobs)."""

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from jobqueue import lifecycle, states
from jobqueue.models import Job, JobClaim, JobEvent, JobGroup

pytestmark = pytest.mark.django_db


def _create(producer, agent, group, **extra):
    body = {"job_agent_id": str(agent.id), **extra}
    if group is not None:
        body["group"] = group
    return producer.post("jobs", json=body)


def test_a_job_is_created_into_a_group_and_listed_by_it(world):
    producer = world.producer()
    r = _create(producer, world.agent, "run-1")
    assert r.status_code == 201 and r.json()["group"] == "run-1"
    _create(producer, world.agent, "run-1")
    _create(producer, world.agent, "run-2")
    ungrouped = _create(producer, world.agent, None)
    assert ungrouped.json()["group"] is None
    listed = producer.get("jobs?group=run-1")
    assert listed.status_code == 200
    assert [j["group"] for j in listed.json()["results"]] == ["run-1", "run-1"]
    assert producer.get("jobs?group=nope").json()["results"] == []
    assert JobGroup.objects.filter(workspace=world.workspace).count() == 2


@pytest.mark.parametrize("group", ["", "a/b", "x" * 201, "tab\there", 7, ".", ".."])
def test_a_bad_group_is_a_400_that_creates_nothing(world, group):
    before = Job.objects.count()
    r = _create(world.producer(), world.agent, group)
    assert r.status_code == 400
    body = r.json()
    assert body["code"] == "validation_error" and "group" in body["fields"]
    assert body["fields"]["group"] != ["Invalid value."]
    if isinstance(group, str) and len(group) >= 4:
        assert group not in r.content.decode()
    assert Job.objects.count() == before and not JobGroup.objects.exists()


def test_dot_segments_are_refused_by_name_and_other_dotted_names_are_groups(world):
    """"." and ".." could be created but never reached: URL clients remove dot segments
    (issue #32, item 11). The error says so; names that merely hold dots are groups."""
    r = _create(world.producer(), world.agent, "..")
    assert r.json()["fields"]["group"] == [
        'Must be 1 to 200 printable characters without "/", and not "." or "..".']
    for name in ("...", ".hidden", "v1.2", "a..b"):
        assert _create(world.producer(), world.agent, name).status_code == 201, name
        assert world.producer().get(f"groups/{name}").json()["group"] == name


def test_group_state_counts_every_status(world):
    producer = world.producer()
    ids = [_create(producer, world.agent, "run").json()["id"] for _ in range(3)]
    grant = lifecycle.claim_job(world.agent, ids[0])
    lifecycle.report_status(ids[0], grant.claim_id, states.SUCCESSFUL)
    lifecycle.claim_job(world.agent, ids[1])
    r = producer.get("groups/run")
    assert r.status_code == 200
    body = r.json()
    assert body["group"] == "run" and body["cancelled_at"] is None
    assert body["finished"] is False
    assert body["counts"] == {"cancelled": 0, "expired": 0, "failure": 0, "in_progress": 1,
                              "pending": 0, "queued": 1, "successful": 1}


@pytest.mark.parametrize("group", ["a%00b", "x%00", "a/b", "", "x" * 201, ".."])
def test_a_list_by_a_group_no_job_could_have_is_a_400(world, group):
    # A NUL reached PostgreSQL's text and was a 500 there (200 on SQLite).
    r = world.producer().get(f"jobs?group={group}&status=queued")
    assert r.status_code == 400
    body = r.json()
    assert body["code"] == "validation_error" and "group" in body["fields"]


@pytest.mark.parametrize("path", ["groups/never", "groups/never/cancel", "groups/a%00b",
                                  "groups/a%00b/cancel", "groups/" + "y" * 201])
def test_an_unknown_group_is_a_404(world, path):
    method = world.producer().post if path.endswith("cancel") else world.producer().get
    r = method(path)
    assert r.status_code == 404 and r.json()["code"] == "not_found"
    assert not JobGroup.objects.exists()


def test_cancel_ends_every_live_job_and_supersedes_the_claims(world):
    producer = world.producer()
    ids = [_create(producer, world.agent, "run").json()["id"] for _ in range(4)]
    held = _create(producer, world.agent, "run", hold=True).json()["id"]
    other = _create(producer, world.agent, "other").json()["id"]
    done = lifecycle.claim_job(world.agent, ids[0])
    lifecycle.report_status(ids[0], done.claim_id, states.FAILURE)
    running = lifecycle.claim_job(world.agent, ids[1])

    r = producer.post("groups/run/cancel", json={"reason": "run aborted"})
    assert r.status_code == 200 and r.json() == {"cancelled": 4}
    statuses = dict(Job.objects.values_list("id", "status"))
    assert {str(k): v for k, v in statuses.items()} == {
        ids[0]: "failure", ids[1]: "cancelled", ids[2]: "cancelled", ids[3]: "cancelled",
        held: "cancelled", other: "queued",
    }
    assert not JobClaim.objects.filter(job_id=ids[1]).exists()
    event = JobEvent.objects.get(job_id=ids[1], kind=JobEvent.CANCELLED)
    assert event.claim_id == running.claim_id
    assert event.detail["reason"] == "run aborted" and event.detail["group_cancelled"] is True
    assert event.actor.startswith("producer:api_key:")
    # The old holder is told why.
    hb = world.agent_caller().post(f"jobs/{ids[1]}/heartbeat",
                                   json={"claim_id": str(running.claim_id)})
    assert hb.status_code == 409 and hb.json()["code"] == "job_cancelled"

    state = producer.get("groups/run").json()
    assert state["finished"] is True and state["cancelled_at"] is not None
    assert state["counts"]["cancelled"] == 4 and state["counts"]["failure"] == 1
    # Repeating it is harmless.
    again = producer.post("groups/run/cancel")
    assert again.status_code == 200 and again.json() == {"cancelled": 0}
    assert producer.get("groups/run").json()["cancelled_at"] == state["cancelled_at"]
    assert JobGroup.objects.get(name="run").cancel_reason == "run aborted"


def test_a_cancelled_group_takes_no_new_jobs_and_no_requeues(world):
    producer = world.producer()
    job_id = _create(producer, world.agent, "run").json()["id"]
    producer.post("groups/run/cancel")
    before = (Job.objects.count(), JobEvent.objects.count())
    r = _create(producer, world.agent, "run")
    assert r.status_code == 409 and r.json()["code"] == "group_cancelled"
    r = producer.post(f"jobs/{job_id}/requeue")
    assert r.status_code == 409 and r.json()["code"] == "group_cancelled"
    assert (Job.objects.count(), JobEvent.objects.count()) == before
    assert Job.objects.get(id=job_id).status == states.CANCELLED
    # Other groups and ungrouped jobs are not affected.
    assert _create(producer, world.agent, "run-2").status_code == 201
    assert _create(producer, world.agent, None).status_code == 201


def test_an_idempotent_replay_into_a_cancelled_group_returns_the_first_job(world):
    producer = world.producer().with_headers({"X-API-Key": world.key, "Idempotency-Key": "k1"})
    first = _create(producer, world.agent, "run")
    world.producer().post("groups/run/cancel")
    replay = _create(producer, world.agent, "run")
    assert replay.status_code == 200 and replay.json()["id"] == first.json()["id"]
    # The group is part of the request: another group with the key is a reuse.
    reuse = _create(producer, world.agent, "other")
    assert reuse.status_code == 422


def test_requeue_of_a_job_of_a_live_group_still_works(world):
    producer = world.producer()
    job_id = _create(producer, world.agent, "run").json()["id"]
    producer.post(f"jobs/{job_id}/cancel")
    r = producer.post(f"jobs/{job_id}/requeue")
    assert r.status_code == 200 and r.json()["status"] == "queued"


@override_settings(JOBQUEUE={"GROUP_CANCEL_BATCH": 3})
def test_cancel_runs_in_bounded_batches(world):
    producer = world.producer()
    for _ in range(10):
        _create(producer, world.agent, "big")
    with CaptureQueriesContext(connection) as ctx:
        r = producer.post("groups/big/cancel")
    assert r.json() == {"cancelled": 10}
    # Four transactions (3 + 3 + 3 + 1), each one UPDATE of the job table.
    updates = [q["sql"] for q in ctx.captured_queries
               if q["sql"].startswith('UPDATE "job" SET "status"')]
    assert len(updates) == 4
    assert Job.objects.filter(group="big", status=states.CANCELLED).count() == 10
    assert JobEvent.objects.filter(kind=JobEvent.CANCELLED).count() == 10


def test_group_cancel_is_for_the_workspace_key_only(world):
    _create(world.producer(), world.agent, "run")
    for method, path in (("GET", "groups/run"), ("POST", "groups/run/cancel")):
        r = world.agent_caller().request(method, path)
        assert r.status_code == 403 and r.json()["code"] == "permission_denied"
    assert JobGroup.objects.get(name="run").cancelled_at is None


def test_a_group_cancel_announces_each_job_it_ended(world):
    from jobqueue.maintenance import webhooks
    from jobqueue.models import WebhookDelivery

    webhooks.create_endpoint(world.workspace.id, "http://127.0.0.1:9/hook")
    producer = world.producer()
    ids = [_create(producer, world.agent, "run").json()["id"] for _ in range(3)]
    grant = lifecycle.claim_job(world.agent, ids[0])
    lifecycle.report_status(ids[0], grant.claim_id, states.SUCCESSFUL)  # announced by itself
    before = set(WebhookDelivery.objects.values_list("job_id", flat=True))
    assert producer.post("groups/run/cancel").json() == {"cancelled": 2}
    after = list(WebhookDelivery.objects.values_list("job_id", flat=True))
    assert len(after) == len(before) + 2
    assert {str(j) for j in set(after) - before} == set(ids[1:])
