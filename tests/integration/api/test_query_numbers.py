"""Numbers in query strings (issue #32, item 8): every integer query parameter the OpenAPI
schema describes takes ASCII digits only. `²`, `①` (which `str.isdigit()` takes and `int()`
refuses: a 500 before), `٣`, `1_0` and ` 5` (which `int()` takes) are each a 400 that names
the parameter and its bounds, never the value."""

import json
from urllib.parse import quote

import pytest

from jobqueue import lifecycle
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db

NOT_ASCII_DIGITS = ["²", "①", "٣", "1_0", " 5", "+5", "5 ", "-1", "", "1.0", "9" * 40]


@pytest.fixture
def paths(world):
    job = JobFactory(job_agent=world.agent)
    lifecycle.claim_job(world.agent, job.id)
    return {"workspace_id": world.workspace.id, "agent_id": world.agent.id, "job_id": job.id,
            "webhook_id": world.producer().post(
                "webhooks", json={"url": "https://example.com/hook"}).json()["id"]}


def integer_query_parameters(doc):
    """(path, name) of every GET operation's integer query parameter in the schema."""
    for path, ops in doc["paths"].items():
        op = ops.get("get")
        for param in (op or {}).get("parameters", []):
            if param["in"] == "query" and param["schema"].get("type") == "integer":
                yield path, param["name"]


def test_every_integer_query_parameter_refuses_what_is_not_ascii_digits(world, paths):
    producer = world.producer()
    doc = json.loads(producer.get("/v1/schema/?format=json").content)
    found = list(integer_query_parameters(doc))
    names = {name for _, name in found}
    assert {"page_size", "wait_seconds", "offset", "attempt"} <= names, names
    for path, name in found:
        url = path.format(**paths)
        for value in NOT_ASCII_DIGITS:
            r = producer.get(f"{url}?{name}={quote(value)}")
            assert r.status_code == 400, (url, name, value, r.content)
            body = r.json()
            assert body["code"] == "validation_error"
            [message] = body["fields"][name]
            assert message.startswith("Must be an integer from "), message
            if len(value.strip()) > 2:
                assert value.strip() not in r.content.decode()


@pytest.mark.parametrize(("query", "message"), [
    ("page_size=501", "Must be an integer from 1 to 500."),
    ("page_size=0", "Must be an integer from 1 to 500."),
    ("wait_seconds=51", "Must be an integer from 0 to 50."),
])
def test_a_bound_is_named(world, paths, query, message):
    url = f"jobs/{paths['job_id']}" if query.startswith("wait") else "jobs"
    r = world.producer().get(f"{url}?{query}")
    assert r.status_code == 400
    [(name, [got])] = r.json()["fields"].items()
    assert query.startswith(name + "=") and got == message


def test_ascii_digits_are_taken(world, paths):
    producer = world.producer()
    job_id = paths["job_id"]
    assert producer.get(f"jobs/{job_id}/log?offset=0&attempt=1").status_code == 200
    assert producer.get("jobs?page_size=007").status_code == 200
    assert producer.get(f"jobs/{job_id}?wait_seconds=0").status_code == 200
