"""One rule for request bodies (issue #32, items 13 and 14), checked on every JSON body the
OpenAPI schema describes: a number is a JSON integer (not "2", 2.0 or true), a field the body
does not declare is a 400 naming it, a value out of bounds is a 400 naming the field and its
bounds; and a refused body changes nothing. Numbers come back the same on both databases."""

import json

import pytest

from jobqueue import lifecycle
from jobqueue.models import Job, JobAgent, JobCheckpoint, JobClaim, JobEvent, WebhookEndpoint
from tests.factories import JobFactory

from .test_no_echo import Bodies, resolve

pytestmark = pytest.mark.django_db


def state():
    """What a refused request must leave as it was."""
    return (
        list(Job.objects.order_by("id").values_list("id", "status", "attempt", "updated_at")),
        list(JobClaim.objects.values_list("claim_id", "claim_expires_at")),
        JobEvent.objects.count(), JobAgent.objects.count(), WebhookEndpoint.objects.count(),
        JobCheckpoint.objects.count(),
    )


def json_bodies(doc):
    """(method, path, body schema) of every operation that takes a JSON body."""
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            content = op.get("requestBody", {}).get("content", {})
            if "application/json" in content:
                yield method.upper(), path, resolve(doc, content["application/json"]["schema"])


def fields_of(doc, body_schema):
    """(where, field name, field schema, body with the field set to a value): the body's own
    fields, and those of its arrays' items."""
    for key, sub in body_schema.get("properties", {}).items():
        yield key, key, resolve(doc, sub), lambda base, value, key=key: {**base, key: value}
        sub = resolve(doc, sub)
        if sub.get("type") == "array" and "properties" in resolve(doc, sub["items"]):
            items = resolve(doc, sub["items"])
            for item_key, item_sub in items["properties"].items():
                def put(base, value, key=key, item_key=item_key):
                    return {**base, key: [{**base[key][0], item_key: value}]}
                yield key, item_key, resolve(doc, item_sub), put


def call(caller, method, url, body):
    return caller.request(method, url, json_body=body)


def refused(response, where, name, *, unknown=False):
    """The one message about `name` a 400 gives, at the top level or inside an item."""
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["code"] == "validation_error"
    if where == name:
        [message] = body["fields"][name]
        return message
    [message] = [m for m in body["fields"][where] if m.startswith(f"0: {name}: ")]
    return message.removeprefix(f"0: {name}: ")


@pytest.fixture
def schema_doc(world):
    return json.loads(world.producer().get("/v1/schema/?format=json").content)


def test_every_integer_field_takes_json_integers_only(world, target, schema_doc):
    bodies = Bodies(schema_doc, target["ids"])
    producer, checked = world.producer(), []
    for method, path, body_schema in json_bodies(schema_doc):
        url = path.format(**target["path"])
        base = bodies.valid(body_schema)
        for where, name, sub, put in fields_of(schema_doc, body_schema):
            if sub.get("type") != "integer":
                continue
            low = sub.get("minimum", 1)
            for value in (str(low), float(low), True, [low], {"n": low}):
                before = state()
                message = refused(call(producer, method, url, put(base, value)), where, name)
                assert message == ("Must be a JSON integer (not a string, a fraction or a "
                                   "boolean)."), (path, name, value, message)
                assert state() == before
            checked.append(name)
    assert {"limit", "wait_seconds", "expected_attempt", "priority", "max_attempts",
            "lease_seconds", "retry_after_seconds", "delay_seconds"} <= set(checked)


def test_every_body_refuses_a_field_it_does_not_declare_and_names_it(world, target,
                                                                      schema_doc):
    bodies = Bodies(schema_doc, target["ids"])
    producer, operations = world.producer(), 0
    for method, path, body_schema in json_bodies(schema_doc):
        operations += 1
        url = path.format(**target["path"])
        base = bodies.valid(body_schema)
        declared = ", ".join(sorted(body_schema["properties"]))
        before = state()
        r = call(producer, method, url, {**base, "wait_secnds": 5})
        assert refused(r, "wait_secnds", "wait_secnds") == (
            f"Unknown field; this body takes {declared}."), (path, r.content)
        assert state() == before
        for key, sub in body_schema["properties"].items():  # the items of a batch
            sub = resolve(schema_doc, sub)
            if sub.get("type") == "array" and "properties" in resolve(schema_doc, sub["items"]):
                item = {**base[key][0], "checkpoint_": 1}
                r = call(producer, method, url, {**base, key: [item]})
                assert refused(r, key, "checkpoint_").startswith("Unknown field; ")
                assert state() == before
    assert operations >= 13


def test_the_issues_loose_inputs_are_refused_and_claim_nothing(world):
    agent = world.agent_caller()
    job = JobFactory(job_agent=world.agent)
    claim_next = f"job-agents/{world.agent.id}/jobs/claim"
    claim = f"job-agents/{world.agent.id}/jobs/{job.id}/claim"
    for url, body in [(claim_next, {"limit": "2"}), (claim, {"expected_attempt": "0"}),
                      (claim, {"expected_attempt": 0.0}), (claim_next, {"wait_seconds": "5"}),
                      (claim_next, {"limt": 2}), (claim, {"holder": "h", "expected": 0})]:
        assert agent.post(url, json=body).status_code == 400, (url, body)
    assert not JobClaim.objects.exists()
    assert agent.post(claim, json={"expected_attempt": 0}).status_code == 200


def test_a_batch_report_takes_no_checkpoint_any_more(world):
    """A final report's checkpoint was dropped silently (the field is only for progress)."""
    job = JobFactory(job_agent=world.agent)
    grant = lifecycle.claim_job(world.agent, job.id)
    report = {"job_id": str(job.id), "claim_id": str(grant.claim_id), "status": "successful",
              "checkpoint": {"step": 3}}
    r = world.agent_caller().post(f"job-agents/{world.agent.id}/reports",
                                  json={"reports": [report]})
    assert r.status_code == 400
    assert r.json()["fields"]["reports"][0].startswith("0: checkpoint: Unknown field; ")
    assert Job.objects.get(id=job.id).status == "in_progress"


def test_an_endpoint_without_a_body_takes_nothing_but_an_empty_object(world):
    producer = world.producer()
    job_id = producer.post("jobs", json={"job_agent_id": str(world.agent.id),
                                         "hold": True}).json()["id"]
    r = producer.post(f"jobs/{job_id}/dispatch", json={"now": True})
    assert r.status_code == 400 and "now" in r.json()["fields"]
    assert Job.objects.get(id=job_id).status == "pending"
    assert producer.post(f"jobs/{job_id}/dispatch", json={}).status_code == 200


def test_unknown_field_names_are_shown_only_when_short_and_printable(world):
    producer = world.producer()
    body = {"job_agent_id": str(world.agent.id), "x" * 101: 1, "tab\there": 2,
            **{f"f{i}": i for i in range(25)}}
    r = producer.post("jobs", json=body)
    assert r.status_code == 400
    fields = r.json()["fields"]
    assert set(fields) == {f"f{i}" for i in range(20)} | {"non_field_errors"}
    assert "x" * 101 not in r.content.decode() and "tab\\t" not in r.content.decode()
    assert fields["non_field_errors"] == [
        "7 more unknown fields (names over 100 characters or not printable are not shown, "
        "nor more than 20)."]
    assert not Job.objects.exists()


@pytest.mark.parametrize(("url", "body", "field", "message"), [
    ("jobs", {"max_attempts": 1000}, "max_attempts",
     "max_attempts must be an integer from 1 to 100."),
    ("jobs", {"retry_backoff_seconds": 10**9}, "retry_backoff_seconds",
     "retry_backoff_seconds must be an integer from 0 to 3600."),
    ("job-agents", {"name": "builder", "lease_seconds": 1}, "lease_seconds",
     "lease_seconds must be an integer from 5 to 3600."),
    ("job-agents", {"name": "builder", "max_attempts": 1000}, "max_attempts",
     "max_attempts must be an integer from 1 to 100."),
    ("claim-next", {"limit": 1000}, "limit", "limit must be an integer from 1 to 100."),
    ("claim-next", {"limit": 10**6}, "limit", "limit must be an integer from 1 to 100."),
    ("claim-next", {"wait_seconds": 500}, "wait_seconds",
     "wait_seconds must be an integer from 0 to 50."),
    ("claim-next", {"limit": 0, "wait_seconds": -1}, "limit",
     "limit must be an integer from 1 to 100."),
    ("jobs", {"priority": 2**40}, "priority",
     "Must be an integer from -2147483647 to 2147483647."),
])
def test_a_bound_is_named_with_its_field(world, url, body, field, message):
    """Issue #32, item 14: these answered "Invalid value." (the last guard against quoting
    the body took the field's name, a key of the body, for a quote)."""
    if url == "claim-next":
        caller, url = world.agent_caller(), f"job-agents/{world.agent.id}/jobs/claim"
    else:
        caller = world.producer()
        body = {"job_agent_id": str(world.agent.id), **body} if url == "jobs" else body
    before = state()
    r = caller.post(url, json=body)
    assert r.status_code == 400
    assert r.json()["fields"][field] == [message]
    assert state() == before


def test_a_rule_naming_the_apis_words_is_not_replaced(world):
    job = JobFactory(job_agent=world.agent)
    grant = lifecycle.claim_job(world.agent, job.id)
    r = world.agent_caller().put(f"jobs/{job.id}/status", json={
        "claim_id": str(grant.claim_id), "status": "successful", "retry": True})
    assert r.json()["fields"] == {"retry": ["retry may be true only with status failure."]}


# --- numbers come back as they are stored, the same on both databases

NUMBERS = ('{"big": 1.5e308, "neg_zero": -0.0, "e16": 1E16, "under": 9999999999999998.0, '
           '"small": 1e-7, "third": 0.30000000000000004, "one": 1.0, "int": -0, '
           '"huge_int": 123456789012345678901234567890, "neg": -2.5e20}')
STORED = {"big": 15 * 10**307, "neg_zero": 0.0, "e16": 10**16, "under": 9999999999999998.0,
          "small": 1e-07, "third": 0.30000000000000004, "one": 1.0, "int": 0,
          "huge_int": 123456789012345678901234567890, "neg": -25 * 10**19}


def with_numbers(fields: dict, *names: str) -> bytes:
    """`fields` as JSON, each of `names` added with NUMBERS as its value, as sent."""
    added = "".join(f', "{name}": {NUMBERS}' for name in names)
    return (json.dumps(fields)[:-1] + added + "}").encode()


def canonical(value) -> str:
    return json.dumps(value, sort_keys=True)


def test_numbers_come_back_as_stored_on_both_databases(world):
    """Issue #32, item 13: on PostgreSQL (jsonb) a checkpoint of 1.5e308 came back as a
    309-digit integer and -0.0 as 0.0, on SQLite as sent. Now both give back what the
    parser read (agents/parsers.py), in a result, a checkpoint, a job's config and context:
    the same JSON text on both databases (but for the order of an object's keys, which
    PostgreSQL sorts)."""
    expected = canonical(STORED)
    raw = with_numbers({"job_agent_id": str(world.agent.id)}, "job_agent_config",
                       "dispatch_context")
    producer, agent = world.producer(), world.agent_caller()
    r = producer.request("POST", "jobs", raw=raw)
    assert r.status_code == 201, r.content
    job_id = r.json()["id"]
    claim = agent.post(f"job-agents/{world.agent.id}/jobs/{job_id}/claim").json()
    assert canonical(claim["job"]["job_agent_config"]) == expected
    assert canonical(claim["job"]["dispatch_context"]) == expected
    claim_id = claim["claim"]["claim_id"]
    r = agent.request("POST", f"jobs/{job_id}/heartbeat",
                      raw=with_numbers({"claim_id": claim_id}, "checkpoint"))
    assert r.status_code == 200, r.content
    assert agent.post(f"jobs/{job_id}/release", json={"claim_id": claim_id}).status_code == 200
    claim = agent.post(f"job-agents/{world.agent.id}/jobs/{job_id}/claim").json()
    assert canonical(claim["claim"]["checkpoint"]) == expected
    r = agent.request("PUT", f"jobs/{job_id}/status", raw=with_numbers(
        {"claim_id": claim["claim"]["claim_id"], "status": "successful"}, "result"))
    assert r.status_code == 200, r.content
    assert canonical(r.json()["result"]) == expected
    assert canonical(producer.get(f"jobs/{job_id}").json()["result"]) == expected
    assert canonical(Job.objects.get(id=job_id).result) == expected
