"""Rate limits over HTTP, their inputs and outputs (#29 item 3; docs/api.md "Rate limit
endpoints"): POST jobs, each job of POST flows and a schedule's `job` take `rate_limit_key`
(1 to 255 printable characters) and every job shape shows it (null for a plain job), never the
internal `rate_held`; `PUT/GET/DELETE rate-limits/{key}` and `GET rate-limits` set, read,
remove and list a workspace's limits, for keys of any printable characters (a "/", a space,
a "%", percent-encoded in the path). Each bad input is a 400 validation_error naming its
field, and nothing is created or changed."""

from __future__ import annotations

import datetime as dt
import uuid
from urllib.parse import quote

import pytest

from jobqueue.db import db_now
from jobqueue.lifecycle import ratelimits
from jobqueue.maintenance import schedules as service
from jobqueue.models import Job, RateLimit, Schedule

pytestmark = pytest.mark.django_db

LIMIT_FIELDS = {"key", "count", "period_seconds", "created_at", "updated_at"}


def _create(world, **body):
    r = world.producer().post("jobs", json={"job_agent_id": str(world.agent.id), **body})
    assert r.status_code == 201, r.content
    return r.json()


def _shapes(world, job_id):
    """The job as GET jobs/{id} and GET jobs show it."""
    producer = world.producer()
    detail = producer.get(f"jobs/{job_id}").json()
    [summary] = [j for j in producer.get("jobs").json()["results"] if j["id"] == job_id]
    return detail, summary


def _path(key: str) -> str:
    """rate-limits/{key}, the key percent-encoded as a client sends it (a "." segment too)."""
    return "rate-limits/" + quote(key, safe="").replace(".", "%2E")


def _limits():
    return sorted(RateLimit.objects.values_list("workspace_id", "key", "count",
                                                "period_seconds", "updated_at"))


# --- rate_limit_key on jobs ----------------------------------------------------------------


def test_a_key_shows_in_every_shape(world):
    made = _create(world, rate_limit_key="partner-api")
    assert made["rate_limit_key"] == "partner-api"
    assert "rate_held" not in made
    for shape in _shapes(world, made["id"]):
        assert shape["rate_limit_key"] == "partner-api"
        assert "rate_held" not in shape
    assert Job.objects.get(id=made["id"]).rate_limit_key == "partner-api"
    # The bounds themselves, any printable characters, and a labelled job.
    for key in ("k" * 255, "a/b", "deploy prod", "50% off", "ключ", "."):
        assert _create(world, rate_limit_key=key)["rate_limit_key"] == key
    r = world.producer().post("jobs", json={"labels": ["gpu"], "rate_limit_key": "gpu-api"})
    assert r.status_code == 201, r.content
    assert r.json()["rate_limit_key"] == "gpu-api"
    # With a concurrency key too: both are kept.
    both = _create(world, rate_limit_key="api", concurrency_key="api", concurrency_limit=2)
    assert (both["rate_limit_key"], both["concurrency_key"], both["concurrency_limit"]) == (
        "api", "api", 2)


def test_a_plain_job_shows_null(world):
    made = _create(world)
    assert made["rate_limit_key"] is None
    for shape in _shapes(world, made["id"]):
        assert shape["rate_limit_key"] is None
    assert _create(world, rate_limit_key=None)["rate_limit_key"] is None


# (A NUL anywhere in a body is refused before any field is read: docs/api.md, "Times".)
BAD_KEYS = ["", "k" * 256, "new\nline", "tab\there", "bell\x07", "\u2028", 7, 2.5, True,
            ["k"], {"k": 1}]


@pytest.mark.parametrize("key", BAD_KEYS)
def test_a_bad_key_is_a_400_naming_the_field_and_nothing_is_created(world, key):
    r = world.producer().post("jobs", json={"job_agent_id": str(world.agent.id),
                                            "rate_limit_key": key})
    assert r.status_code == 400, r.content
    assert r.json()["code"] == "validation_error" and "rate_limit_key" in r.json()["fields"]
    assert not Job.objects.exists()


def test_an_idempotent_replay_counts_the_key_as_sent(world):
    producer = world.producer()
    body = {"job_agent_id": str(world.agent.id), "rate_limit_key": "k"}
    key = {"Idempotency-Key": "rate-1"}
    first = producer.post("jobs", json=body, headers=key)
    assert first.status_code == 201, first.content
    again = producer.post("jobs", json=body, headers=key)
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    assert again.json()["rate_limit_key"] == "k"
    for other in ({**body, "rate_limit_key": "other"}, {"job_agent_id": str(world.agent.id)}):
        assert producer.post("jobs", json=other, headers=key).status_code == 422
    assert Job.objects.count() == 1


def test_a_flow_takes_it_per_job(world):
    agent = str(world.agent.id)
    r = world.producer().post("flows", json={"jobs": [
        {"ref": "a", "job_agent_id": agent, "rate_limit_key": "partner"},
        {"ref": "b", "job_agent_id": agent, "rate_limit_key": "a/b c%",
         "depends_on_refs": ["a"]},
        {"ref": "c", "labels": ["gpu"], "rate_limit_key": "gpu"},
        {"ref": "d", "job_agent_id": agent},
    ]})
    assert r.status_code == 201, r.content
    jobs = r.json()["jobs"]
    assert {ref: j["rate_limit_key"] for ref, j in jobs.items()} == {
        "a": "partner", "b": "a/b c%", "c": "gpu", "d": None}
    assert all("rate_held" not in j for j in jobs.values())
    stored = dict(Job.objects.values_list("id", "rate_limit_key"))
    assert {ref: stored[uuid.UUID(j["id"])] for ref, j in jobs.items()} == {
        "a": "partner", "b": "a/b c%", "c": "gpu", "d": None}


@pytest.mark.parametrize("key, field", [
    ("", "0: rate_limit_key"),
    ("k" * 256, "0: rate_limit_key"),
    (7, "0: rate_limit_key"),
    (True, "0: rate_limit_key"),
    ("new\nline", "jobs[1].rate_limit_key"),
    ("bell\x07", "jobs[1].rate_limit_key"),
])
def test_a_bad_flow_job_is_400_naming_the_field_and_nothing_is_made(world, key, field):
    """A key the body's shape refuses is named within `jobs` ("1: rate_limit_key: ..."), one
    the lifecycle's rule refuses as jobs[1].rate_limit_key; either way, no job of the flow."""
    agent = str(world.agent.id)
    r = world.producer().post("flows", json={"jobs": [
        {"ref": "ok", "job_agent_id": agent, "rate_limit_key": "fine"},
        {"ref": "bad", "job_agent_id": agent, "rate_limit_key": key}]})
    assert r.status_code == 400, r.content
    body = r.json()
    assert body["code"] == "validation_error", body
    if field.startswith("jobs["):
        assert field in body["fields"], body
    else:
        assert body["fields"]["jobs"][0].startswith("1: " + field.split(": ", 1)[1]), body
    assert not Job.objects.exists()


def _schedule(world, **job):
    return {"name": "nightly", "cron": "30 2 * * *", "overlap": "allow",
            "job": {"job_agent_id": str(world.agent.id), **job}}


def test_a_schedule_keeps_it_and_its_jobs_carry_it(world):
    producer = world.producer()
    r = producer.post("schedules", json=_schedule(world, rate_limit_key="report-api"))
    assert r.status_code == 201, r.content
    schedule = r.json()
    assert schedule["job"]["rate_limit_key"] == "report-api"
    assert producer.get(f"schedules/{schedule['id']}").json()["job"] == schedule["job"]
    # A trigger's job and a fire's job.
    triggered = producer.post(f"schedules/{schedule['id']}/trigger")
    assert triggered.status_code == 201, triggered.content
    assert triggered.json()["rate_limit_key"] == "report-api"
    when = db_now().replace(microsecond=0) - dt.timedelta(seconds=30)
    Schedule.objects.filter(id=schedule["id"]).update(next_fire_at=when)
    service.run_once()
    assert Job.objects.get(scheduled_for=when).rate_limit_key == "report-api"
    # A new job body with another key; then one without: plain jobs.
    r = producer.request("PATCH", f"schedules/{schedule['id']}",
                         json_body={"job": {"job_agent_id": str(world.agent.id),
                                            "rate_limit_key": "other"}})
    assert r.status_code == 200, r.content
    assert producer.post(f"schedules/{schedule['id']}/trigger").json()["rate_limit_key"] == (
        "other")
    plain = producer.post("schedules", json={**_schedule(world), "name": "plain"}).json()
    assert "rate_limit_key" not in plain["job"]
    assert producer.post(f"schedules/{plain['id']}/trigger").json()["rate_limit_key"] is None


@pytest.mark.parametrize("key", ["", "k" * 256, "new\nline", 7, True])
def test_a_bad_schedule_job_is_400_naming_job_and_nothing_is_made(world, key):
    producer = world.producer()
    r = producer.post("schedules", json=_schedule(world, rate_limit_key=key))
    assert r.status_code == 400, r.content
    body = r.json()
    assert body["code"] == "validation_error" and "job" in body["fields"], body
    assert body["fields"]["job"][0].startswith("rate_limit_key"), body
    assert not Schedule.objects.exists() and not Job.objects.exists()
    # The same job as a change of an existing schedule: refused, nothing changed.
    schedule_id = producer.post("schedules", json=_schedule(world)).json()["id"]
    before = list(Schedule.objects.values())
    r = producer.request("PATCH", f"schedules/{schedule_id}",
                         json_body={"job": _schedule(world, rate_limit_key=key)["job"]})
    assert r.status_code == 400, r.content
    assert "job" in r.json()["fields"]
    assert list(Schedule.objects.values()) == before


# --- PUT / GET / DELETE rate-limits/{key}, GET rate-limits ---------------------------------


def test_set_read_replace_and_delete_a_limit(world):
    producer = world.producer()
    r = producer.put("rate-limits/partner-api", json={"count": 10, "period_seconds": 60})
    assert r.status_code == 200, r.content
    made = r.json()
    assert set(made) == LIMIT_FIELDS
    assert (made["key"], made["count"], made["period_seconds"]) == ("partner-api", 10, 60)
    assert made["created_at"] and made["updated_at"]
    got = producer.get("rate-limits/partner-api")
    assert got.status_code == 200 and got.json() == made
    # A PUT again replaces it: the same row, its created_at kept.
    r = producer.put("rate-limits/partner-api", json={"count": 3, "period_seconds": 1})
    assert r.status_code == 200, r.content
    replaced = r.json()
    assert (replaced["count"], replaced["period_seconds"]) == (3, 1)
    assert replaced["created_at"] == made["created_at"]
    assert replaced["updated_at"] >= made["updated_at"]
    assert RateLimit.objects.count() == 1
    assert producer.get("rate-limits/partner-api").json() == replaced
    # DELETE: 204 without a body; then there is none: GET and DELETE answer 404.
    r = producer.delete("rate-limits/partner-api")
    assert r.status_code == 204 and r.content == b""
    assert not RateLimit.objects.exists()
    for method in ("GET", "DELETE"):
        r = producer.request(method, "rate-limits/partner-api")
        assert r.status_code == 404, (method, r.content)
        assert r.json() == {"code": "not_found", "detail": "No rate limit for this key."}


@pytest.mark.parametrize("count, period", [(1, 1), (100_000, 86_400)])
def test_the_bounds_themselves_are_taken(world, count, period):
    r = world.producer().put("rate-limits/k", json={"count": count, "period_seconds": period})
    assert r.status_code == 200, r.content
    assert (r.json()["count"], r.json()["period_seconds"]) == (count, period)


KEYS = ["a/b", "deploy prod", "50% off", "a/", "/lead", "a//b", "?x=1#frag", ".", "..",
        "a/../b", "ключ", "k" * 255]


@pytest.mark.parametrize("key", KEYS)
def test_a_key_of_any_printable_characters_is_addressed_percent_encoded(world, key):
    producer = world.producer()
    r = producer.put(_path(key), json={"count": 2, "period_seconds": 30})
    assert r.status_code == 200, r.content
    assert r.json()["key"] == key
    assert RateLimit.objects.get().key == key
    assert producer.get(_path(key)).json()["key"] == key
    [listed] = producer.get("rate-limits").json()["results"]
    assert listed["key"] == key
    assert producer.delete(_path(key)).status_code == 204
    assert not RateLimit.objects.exists()


def test_a_slash_may_be_sent_as_it_is_and_a_space_or_percent_encoded(world):
    producer = world.producer()
    assert producer.put("rate-limits/a/b", json={"count": 1, "period_seconds": 5}) \
        .status_code == 200
    assert producer.get("rate-limits/a%2Fb").json()["key"] == "a/b"
    assert producer.put("rate-limits/deploy%20prod",
                        json={"count": 1, "period_seconds": 5}).status_code == 200
    assert producer.put("rate-limits/50%25%20off",
                        json={"count": 1, "period_seconds": 5}).status_code == 200
    assert sorted(RateLimit.objects.values_list("key", flat=True)) == [
        "50% off", "a/b", "deploy prod"]
    # "a" is not "a/b": a key is the whole rest of the path.
    assert producer.get("rate-limits/a").status_code == 404


BAD_PATH_KEYS = ["k" * 256, "new%0Aline", "tab%09here", "nul%00", "del%7F", "%C2%85"]


@pytest.mark.parametrize("key", BAD_PATH_KEYS)
def test_a_bad_key_in_the_path_is_a_400_and_nothing_changes(world, key):
    producer = world.producer()
    ratelimits.set_limit(world.workspace.id, "kept", 5, 60)
    before = _limits()
    for method, body in (("PUT", {"count": 1, "period_seconds": 1}), ("GET", None),
                         ("DELETE", None)):
        r = producer.request(method, f"rate-limits/{key}", json_body=body)
        assert r.status_code == 400, (method, r.content)
        assert r.json()["code"] == "validation_error", r.content
        assert list(r.json()["fields"]) == ["key"], r.content
        assert _limits() == before


def test_no_key_is_a_404_of_the_router(world):
    r = world.producer().get("rate-limits/")
    assert r.status_code == 404 and r.json()["code"] == "not_found"


@pytest.mark.parametrize("body, field", [
    ({"period_seconds": 60}, "count"),
    ({"count": 5}, "period_seconds"),
    ({"count": None, "period_seconds": 60}, "count"),
    ({"count": 5, "period_seconds": None}, "period_seconds"),
    ({"count": 0, "period_seconds": 60}, "count"),
    ({"count": -1, "period_seconds": 60}, "count"),
    ({"count": 100_001, "period_seconds": 60}, "count"),
    ({"count": 2**40, "period_seconds": 60}, "count"),
    ({"count": 5, "period_seconds": 0}, "period_seconds"),
    ({"count": 5, "period_seconds": 86_401}, "period_seconds"),
    ({"count": "5", "period_seconds": 60}, "count"),
    ({"count": 5.0, "period_seconds": 60}, "count"),
    ({"count": True, "period_seconds": 60}, "count"),
    ({"count": [5], "period_seconds": 60}, "count"),
    ({"count": 5, "period_seconds": "60"}, "period_seconds"),
    ({"count": 5, "period_seconds": 60, "burst": 2}, "burst"),
    ({}, "count"),
])
def test_a_bad_body_is_a_400_naming_the_field_and_changes_nothing(world, body, field):
    producer = world.producer()
    ratelimits.set_limit(world.workspace.id, "k", 5, 60)
    before = _limits()
    r = producer.put("rate-limits/k", json=body)
    assert r.status_code == 400, r.content
    assert r.json()["code"] == "validation_error" and field in r.json()["fields"], r.content
    assert _limits() == before
    # Nor is a limit made for a key that had none.
    assert producer.put("rate-limits/new", json=body).status_code == 400
    assert _limits() == before


def test_a_body_that_is_not_an_object_or_not_json_is_refused(world):
    producer = world.producer()
    for raw, ctype, status in ((b"[1, 2]", "application/json", 400),
                               (b"{", "application/json", 400),
                               (b"", "application/json", 400),
                               (b"count=1", "application/x-www-form-urlencoded", 415)):
        r = producer.request("PUT", "rate-limits/k", raw=raw, content_type=ctype)
        assert r.status_code == status, (raw, r.content)
    assert not RateLimit.objects.exists()


def test_a_bounds_message_names_the_bounds(world):
    r = world.producer().put("rate-limits/k", json={"count": 0, "period_seconds": 86_401})
    assert r.json()["fields"] == {"count": ["Must be an integer from 1 to 100000."],
                                  "period_seconds": ["Must be an integer from 1 to 86400."]}


def test_patch_and_post_are_not_allowed(world):
    producer = world.producer()
    ratelimits.set_limit(world.workspace.id, "k", 5, 60)
    before = _limits()
    for method, path in (("PATCH", "rate-limits/k"), ("POST", "rate-limits/k"),
                         ("POST", "rate-limits"), ("DELETE", "rate-limits")):
        r = producer.request(method, path, json_body={"count": 1, "period_seconds": 1})
        assert r.status_code == 405 and r.json()["code"] == "method_not_allowed", (method, path)
    assert _limits() == before


def test_the_list_is_by_key_page_after_page_and_the_workspaces_own(world):
    producer = world.producer()
    keys = ["e", "c", "a", "d", "b"]
    for n, key in enumerate(keys, start=1):
        assert producer.put(f"rate-limits/{key}",
                            json={"count": n, "period_seconds": 60}).status_code == 200
    ratelimits.set_limit(world.other_workspace.id, "a", 99, 99)  # another workspace's
    ratelimits.set_limit(world.other_workspace.id, "zz-other", 99, 99)
    page = producer.get("rate-limits").json()
    assert [limit["key"] for limit in page["results"]] == ["a", "b", "c", "d", "e"]
    assert page["results"][0] == {**page["results"][0], "count": 3, "period_seconds": 60}
    assert all(set(limit) == LIMIT_FIELDS for limit in page["results"])
    assert page["next"] is None and page["previous"] is None
    seen, url = [], "rate-limits?page_size=2"
    while url:
        page = producer.get(url).json()
        assert len(page["results"]) <= 2
        seen += [limit["key"] for limit in page["results"]]
        url = page["next"] and "rate-limits?" + page["next"].split("?", 1)[1]
    assert seen == ["a", "b", "c", "d", "e"]
    # Back one page from the last.
    last = producer.get("rate-limits?page_size=2").json()
    last = producer.get("rate-limits?" + last["next"].split("?", 1)[1]).json()
    back = producer.get("rate-limits?" + last["previous"].split("?", 1)[1]).json()
    assert [limit["key"] for limit in back["results"]] == ["a", "b"]
    for bad in ("cursor=nonsense", "page_size=0", "page_size=501"):
        r = producer.get(f"rate-limits?{bad}")
        assert r.status_code == 400 and r.json()["code"] == "validation_error", bad


def test_a_cursor_of_another_listing_is_refused(world):
    producer = world.producer()
    producer.post("webhooks", json={"url": "https://example.com/a"})
    producer.post("webhooks", json={"url": "https://example.com/b"})
    nxt = producer.get("webhooks?page_size=1").json()["next"]
    r = producer.get("rate-limits?" + nxt.split("?", 1)[1])
    assert r.status_code == 400 and "cursor" in r.json()["fields"]


def test_a_workspaces_limits_are_its_own(world):
    producer = world.producer()
    ratelimits.set_limit(world.other_workspace.id, "shared", 7, 70)
    assert producer.get("rate-limits/shared").status_code == 404
    assert producer.delete("rate-limits/shared").status_code == 404
    assert producer.put("rate-limits/shared", json={"count": 1, "period_seconds": 10}) \
        .json()["count"] == 1
    assert ratelimits.get_limit(world.other_workspace.id, "shared").count == 7
    assert ratelimits.get_limit(world.workspace.id, "shared").count == 1
    # The other workspace in the path: 404, nothing changed.
    before = _limits()
    other = f"/v1/workspaces/{world.other_workspace.id}/rate-limits/shared"
    for method, body in (("PUT", {"count": 2, "period_seconds": 2}), ("GET", None),
                         ("DELETE", None)):
        r = producer.request(method, other, json_body=body)
        assert r.status_code == 404 and r.json()["code"] == "not_found", method
    assert _limits() == before


def _claim_next(world):
    return world.agent_caller().post(f"job-agents/{world.agent.id}/jobs/claim")


def test_a_limit_set_over_http_holds_its_jobs_back_and_its_delete_lets_them_go(world):
    producer = world.producer()
    assert producer.put("rate-limits/partner", json={"count": 1, "period_seconds": 3600}) \
        .status_code == 200
    first, second = (_create(world, rate_limit_key="partner") for _ in range(2))
    plain = _create(world)
    claimed = _claim_next(world)
    assert claimed.status_code == 200 and claimed.json()["job"]["id"] == first["id"]
    # The window is full: the other job of the key waits, a plain job does not.
    claimed = _claim_next(world)
    assert claimed.status_code == 200 and claimed.json()["job"]["id"] == plain["id"]
    assert _claim_next(world).status_code == 204
    # Raising the limit gives the held job a permit at once.
    assert producer.put("rate-limits/partner", json={"count": 2, "period_seconds": 3600}) \
        .status_code == 200
    claimed = _claim_next(world)
    assert claimed.status_code == 200 and claimed.json()["job"]["id"] == second["id"]
    # Removing the limit: the key limits nothing.
    third = _create(world, rate_limit_key="partner")
    assert _claim_next(world).status_code == 204
    assert producer.delete("rate-limits/partner").status_code == 204
    claimed = _claim_next(world)
    assert claimed.status_code == 200 and claimed.json()["job"]["id"] == third["id"]
