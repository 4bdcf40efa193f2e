"""The webhooks API (workspace key): create (the secret answered once), list (never the
secret), an endpoint's deliveries, delete; bad input is a 400 that changes nothing and never
repeats what was sent."""

import pytest

from jobqueue import lifecycle, states
from jobqueue.models import WebhookDelivery, WebhookEndpoint
from tests.factories import claimed_job

pytestmark = pytest.mark.django_db


def test_create_list_deliveries_and_delete(world):
    producer = world.producer()
    r = producer.post("webhooks", json={"url": "https://hooks.example.com/jq?x=1",
                                         "events": ["job.finished"]})
    assert r.status_code == 201, r.content
    created = r.json()
    assert set(created) == {"id", "url", "events", "created_at", "secret"}
    assert created["secret"].startswith("whsec_") and len(created["secret"]) > 40
    assert created["events"] == ["job.finished"]
    assert WebhookEndpoint.objects.get(id=created["id"]).secret == created["secret"]
    everything = producer.post("webhooks", json={"url": "http://127.0.0.1:9/all"}).json()
    assert everything["events"] == []  # omitted: all events

    listing = producer.get("webhooks")
    assert listing.status_code == 200
    body = listing.json()
    assert [w["id"] for w in body["results"]] == [everything["id"], created["id"]]
    assert created["secret"] not in listing.content.decode()
    assert "secret" not in body["results"][0]

    job, grant = claimed_job(job_agent=world.agent, dispatch_context={"k": "hunter2-api-x"})
    lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL)
    r = producer.get(f"webhooks/{created['id']}/deliveries")
    assert r.status_code == 200
    (d,) = r.json()["results"]
    assert (d["job_id"], d["group"], d["event"], d["status"], d["attempts"]) == (
        str(job.id), None, "job.finished", "pending", 0)
    assert "hunter2-api-x" not in r.content.decode() and "payload" not in d
    grouped, _ = lifecycle.create_job(workspace=world.workspace, job_agent=world.agent,
                                      group="nightly-7")
    lifecycle.cancel_job(grouped.id)
    lifecycle.mark_finished_groups(10)
    newest = producer.get(f"webhooks/{created['id']}/deliveries").json()["results"]
    assert [(d["event"], d["group"], d["job_id"]) for d in newest] == [
        ("job.finished", None, str(grouped.id)), ("job.finished", None, str(job.id))]
    newest = producer.get(f"webhooks/{everything['id']}/deliveries").json()["results"]
    assert [(d["event"], d["group"]) for d in newest][:2] == [
        ("group.finished", "nightly-7"), ("job.finished", None)]

    assert producer.delete(f"webhooks/{created['id']}").status_code == 204
    assert not WebhookDelivery.objects.filter(endpoint_id=created["id"]).exists()
    gone = producer.delete(f"webhooks/{created['id']}")
    assert gone.status_code == 404 and gone.json()["code"] == "not_found"
    assert producer.get(f"webhooks/{created['id']}/deliveries").status_code == 404
    assert producer.get("webhooks/not-a-uuid/deliveries").status_code == 404


@pytest.mark.parametrize("body, field", [
    ({}, "url"),
    ({"url": "ftp://files.example.com/hook-secret-value"}, "url"),
    ({"url": "https:///no-host-secret-value"}, "url"),
    ({"url": "https://user:pw-secret-value@example.com/"}, "url"),
    ({"url": "http://example.com:99999/secret-value"}, "url"),
    ({"url": "http://exa mple.com/secret-value"}, "url"),
    ({"url": "https://example.com/" + "a" * 2000}, "url"),
    ({"url": 12345}, "url"),
    ({"url": "https://example.com/", "events": ["job.secret-value"]}, "events"),
    ({"url": "https://example.com/", "events": "job.finished"}, "events"),
    ({"url": "https://example.com/", "events": ["job.finished"] * 3}, "events"),
])
def test_bad_input_is_a_400_that_changes_nothing_and_never_repeats_it(world, body, field):
    r = world.producer().post("webhooks", json=body)
    assert r.status_code == 400, r.content
    out = r.json()
    assert out["code"] == "validation_error" and field in out["fields"]
    assert "secret-value" not in r.content.decode() and "a" * 100 not in r.content.decode()
    assert not WebhookEndpoint.objects.exists()


def test_an_agent_token_may_not_manage_webhooks(world):
    r = world.agent_caller().post("webhooks", json={"url": "https://example.com/"})
    assert r.status_code == 403 and r.json()["code"] == "permission_denied"
    assert not WebhookEndpoint.objects.exists()


def test_a_workspace_has_at_most_the_capped_number_of_endpoints(world, settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "MAX_WEBHOOKS_PER_WORKSPACE": 2}
    producer = world.producer()
    made = [producer.post("webhooks", json={"url": f"http://127.0.0.1:9/{n}"}) for n in (1, 2)]
    assert [r.status_code for r in made] == [201, 201]
    refused = producer.post("webhooks", json={"url": "http://127.0.0.1:9/3"})
    assert refused.status_code == 409, refused.content
    body = refused.json()
    assert body["code"] == "webhook_limit_reached"
    assert "JOBQUEUE_MAX_WEBHOOKS_PER_WORKSPACE" in body["detail"] and "2" in body["detail"]
    assert WebhookEndpoint.objects.count() == 2  # nothing made
    assert producer.delete(f"webhooks/{made[0].json()['id']}").status_code == 204
    assert producer.post("webhooks", json={"url": "http://127.0.0.1:9/4"}).status_code == 201
