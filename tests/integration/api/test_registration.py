"""Registration (#28 item 2; docs/api.md "Registering an agent"): registration tokens (the
workspace key's: issue once, list, revoke) and POST /v1/register, which creates a job agent
and its token; labels a subset of the token's; one 401 for every unusable token; counted
uses, race-safe on PostgreSQL; a refused registration uses nothing; throttled per address."""

import datetime as dt
import threading

import pytest
from django.core.cache import cache
from django.db import connection
from django.test import Client
from django.utils.dateparse import parse_datetime

from agents import registration
from agents.models import AgentToken, RegistrationToken
from jobqueue import lifecycle
from jobqueue.db import NowPlusSeconds, db_now
from jobqueue.models import JobAgent

from .conftest import Caller

pytestmark = pytest.mark.django_db


def _register(body, client=None, **extra):
    client = client or Client()
    return client.post("/v1/register", data=body, content_type="application/json", **extra)


def _issue(world, **body):
    r = world.producer().post("registration-tokens", json=body)
    assert r.status_code == 201, r.content
    return r.json()


def _state():
    return (sorted(RegistrationToken.objects.values_list("id", "uses", "revoked_at")),
            sorted(JobAgent.objects.values_list("id", "name", "labels")),
            AgentToken.objects.count())


def test_an_agent_registers_and_works_with_the_token_it_gets(world):
    issued = _issue(world, description="fleet", labels=["linux", "gpu"], max_uses=2,
                    token_ttl_seconds=86400)
    assert issued["token"].startswith("jqr_") and issued["uses"] == 0
    assert issued["labels"] == ["gpu", "linux"] and issued["max_uses"] == 2
    assert _near(issued["expires_at"], db_now() + dt.timedelta(seconds=3600))
    r = _register({"registration_token": issued["token"], "name": "runner-1",
                   "labels": ["linux"]})
    assert r.status_code == 201, r.content
    body = r.json()
    assert set(body) == {"workspace_id", "job_agent", "token", "token_expires_at", "settings"}
    assert body["workspace_id"] == str(world.workspace.id)
    assert body["job_agent"]["name"] == "runner-1" and body["job_agent"]["labels"] == ["linux"]
    assert body["settings"] == {"lease_seconds": 60, "heartbeat_interval_seconds": 20,
                                "max_wait_seconds": 50}
    assert _near(body["token_expires_at"], db_now() + dt.timedelta(seconds=86400))
    agent_id = body["job_agent"]["id"]
    # The agent works with its token, as any agent.
    agent = Caller(world.workspace.id, {"Authorization": f"Bearer {body['token']}"})
    job = lifecycle.create_job(workspace=world.workspace,
                               job_agent=JobAgent.objects.get(id=agent_id)).job
    claimed = agent.post(f"job-agents/{agent_id}/jobs/claim")
    assert claimed.status_code == 200 and claimed.json()["job"]["id"] == str(job.id)
    # The operator sees it, its labels, and the token's count.
    seen = world.producer().get(f"job-agents/{agent_id}").json()
    assert seen["labels"] == ["linux"] and seen["online"] is True
    listed = world.producer().get("registration-tokens").json()["results"]
    assert [t["uses"] for t in listed if t["id"] == issued["id"]] == [1]
    assert issued["token"] not in str(listed) and "token" not in listed[0]
    # Without labels, the agent gets the token's.
    r = _register({"registration_token": issued["token"], "name": "runner-2"})
    assert r.status_code == 201 and r.json()["job_agent"]["labels"] == ["gpu", "linux"]
    assert r.json()["token_expires_at"] is not None


def _near(value, expected, slack=5):
    return abs((parse_datetime(value) - expected).total_seconds()) <= slack


@pytest.mark.parametrize("case", ["unknown", "malformed", "revoked", "expired", "used_up",
                                  "another_kind"])
def test_every_unusable_token_gets_the_same_401(world, case):
    issued = _issue(world, max_uses=1)
    raw = issued["token"]
    if case == "unknown":
        raw = raw[:-4] + ("AAAA" if not raw.endswith("AAAA") else "BBBB")
    elif case == "malformed":
        raw = "not-a-token"
    elif case == "revoked":
        assert world.producer().delete(f"registration-tokens/{issued['id']}").status_code == 204
    elif case == "expired":
        RegistrationToken.objects.filter(id=issued["id"]).update(expires_at=NowPlusSeconds(-1))
    elif case == "used_up":
        assert _register({"registration_token": raw, "name": "first"}).status_code == 201
    elif case == "another_kind":
        raw = world.token  # an agent token is no registration token
    before = _state()
    r = _register({"registration_token": raw, "name": "intruder"})
    assert r.status_code == 401 and r.json()["code"] == "registration_token_invalid"
    assert r.headers["WWW-Authenticate"].startswith("RegistrationToken")
    assert _state() == before


def test_labels_beyond_the_tokens_are_403_and_use_nothing(world):
    issued = _issue(world, labels=["linux"])
    before = _state()
    r = _register({"registration_token": issued["token"], "name": "n",
                   "labels": ["linux", "gpu"]})
    assert r.status_code == 403 and r.json()["code"] == "labels_not_allowed"
    assert _state() == before
    # An unusable token is the one 401, whatever labels it asks.
    world.producer().delete(f"registration-tokens/{issued['id']}")
    r = _register({"registration_token": issued["token"], "name": "n", "labels": ["gpu"]})
    assert r.status_code == 401 and r.json()["code"] == "registration_token_invalid"
    # A token bound to no labels lets the agent ask for any.
    free = _issue(world)
    r = _register({"registration_token": free["token"], "name": "n", "labels": ["gpu"]})
    assert r.status_code == 201 and r.json()["job_agent"]["labels"] == ["gpu"]


def test_a_name_taken_is_409_and_uses_nothing(world):
    issued = _issue(world, max_uses=5)
    before = _state()
    r = _register({"registration_token": issued["token"], "name": world.agent.name})
    assert r.status_code == 409 and r.json()["code"] == "agent_name_taken"
    assert _state() == before
    assert RegistrationToken.objects.get(id=issued["id"]).uses == 0


@pytest.mark.parametrize("body, field", [
    ({"name": "n"}, "registration_token"),
    ({"registration_token": "jqr_x"}, "name"),
    ({"registration_token": "jqr_x", "name": ""}, "name"),
    ({"registration_token": "jqr_x", "name": "n", "labels": ["bad label"]}, "labels"),
    ({"registration_token": "jqr_x", "name": "n", "labels": "linux"}, "labels"),
    ({"registration_token": "jqr_x", "name": "n", "labels": ["x"] * 33}, "labels"),
    ({"registration_token": "jqr_x", "name": "n", "labels": ["a" * 64]}, "labels"),
    ({"registration_token": 5, "name": "n"}, "registration_token"),
    ({"registration_token": "jqr_x", "name": "n", "extra": 1}, "extra"),
])
def test_a_malformed_registration_is_400_naming_the_field(world, body, field):
    before = _state()
    r = _register(body)
    assert r.status_code == 400 and r.json()["code"] == "validation_error"
    assert field in r.json()["fields"], r.json()
    assert _state() == before


@pytest.mark.parametrize("body, field", [
    ({"max_uses": 0}, "max_uses"), ({"max_uses": "2"}, "max_uses"),
    ({"expires_in_seconds": 0}, "expires_in_seconds"),
    ({"expires_in_seconds": 30 * 24 * 3600 + 1}, "expires_in_seconds"),
    ({"token_ttl_seconds": 0}, "token_ttl_seconds"),
    ({"token_ttl_seconds": 365 * 24 * 3600 + 1}, "token_ttl_seconds"),
    ({"labels": ["ok", "not ok"]}, "labels"), ({"description": "x" * 501}, "description"),
])
def test_a_registration_token_out_of_bounds_is_400(world, body, field):
    before = _state()
    r = world.producer().post("registration-tokens", json=body)
    assert r.status_code == 400 and list(r.json()["fields"]) == [field]
    assert _state() == before


def test_a_registration_token_is_no_workspace_credential(world):
    issued = _issue(world)
    for headers in ({"X-API-Key": issued["token"]},
                    {"Authorization": f"Bearer {issued['token']}"}):
        caller = Caller(world.workspace.id, headers)
        assert caller.get("jobs").status_code == 401
        assert caller.get("registration-tokens").status_code == 401
    # The workspace key's other workspace sees none of them; an agent token none at all.
    other = Caller(world.other_workspace.id, {"X-API-Key": world.other_key})
    assert other.get("registration-tokens").json()["results"] == []
    assert other.delete(f"registration-tokens/{issued['id']}").status_code == 404
    assert world.agent_caller().get("registration-tokens").status_code == 403
    assert world.producer().delete("registration-tokens/not-an-id").status_code == 404


def test_registration_is_throttled_per_client_address(world, settings):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {
        **settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"], "register": "3/m"}}
    cache.clear()
    issued = _issue(world, max_uses=10)
    answers = [_register({"registration_token": issued["token"], "name": f"a{i}"},
                         REMOTE_ADDR="10.0.0.1").status_code for i in range(4)]
    assert answers == [201, 201, 201, 429]
    # A made-up X-Forwarded-For is no other address (JOBQUEUE_NUM_PROXIES 0: the peer's).
    r = _register({"registration_token": issued["token"], "name": "x"},
                  REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR="192.0.2.77")
    assert r.status_code == 429
    # Another address has its own count.
    assert _register({"registration_token": issued["token"], "name": "b"},
                     REMOTE_ADDR="10.0.0.2").status_code == 201
    cache.clear()


def test_the_functions_refuse_as_the_endpoint_does(world):
    row, raw = registration.issue(world.workspace.id, labels=["a"], max_uses=1)
    with pytest.raises(registration.LabelsNotAllowed):
        registration.register(raw, "n", ["b"])
    agent, token, secret = registration.register(raw, "n")
    assert agent.labels == ["a"] and token.expires_at is None and secret.startswith("jqa_")
    with pytest.raises(registration.RegistrationTokenInvalid):
        registration.register(raw, "m")


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_racing_registrations_make_exactly_max_uses_agents(world):
    """Twelve registrations at once with a token of max_uses 5: exactly five agents, and the
    token counts five uses."""
    row, raw = registration.issue(world.workspace.id, max_uses=5)
    barrier = threading.Barrier(12)
    made, refused = [], []

    def register(i):
        try:
            barrier.wait()
            made.append(registration.register(raw, f"racer-{i}")[0].id)
        except registration.RegistrationTokenInvalid:
            refused.append(i)
        finally:
            connection.close()

    threads = [threading.Thread(target=register, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 5 and len(refused) == 7
    assert JobAgent.objects.filter(name__startswith="racer-").count() == 5
    assert RegistrationToken.objects.get(id=row.id).uses == 5
