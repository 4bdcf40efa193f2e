"""Fair shares over HTTP, their inputs and outputs (#29 item 2; docs/api.md "Fair share
endpoints"): POST jobs, each job of POST flows and a schedule's `job` take `fairness_key`
(1 to 255 printable characters) and every job shape shows it (null for a plain job), never the
internal `fair_at`; `PUT/GET/DELETE fairness-keys/{key}` and `GET fairness-keys` set, read,
remove and list a workspace's weights, for keys of any printable characters (a "/", a space,
a "%", percent-encoded in the path). Each bad input is a 400 validation_error naming its
field, and nothing is created or changed."""

from __future__ import annotations

import datetime as dt
import uuid
from urllib.parse import quote

import pytest

from jobqueue.db import db_now
from jobqueue.lifecycle import fairness
from jobqueue.maintenance import schedules as service
from jobqueue.models import FairnessKey, Job, Schedule

pytestmark = pytest.mark.django_db

WEIGHT_FIELDS = {"key", "weight", "created_at", "updated_at"}


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
    """fairness-keys/{key}, the key percent-encoded as a client sends it (a "." too)."""
    return "fairness-keys/" + quote(key, safe="").replace(".", "%2E")


def _weights():
    return sorted(FairnessKey.objects.values_list("workspace_id", "key", "weight",
                                                  "updated_at"))


# --- fairness_key on jobs ------------------------------------------------------------------


def test_a_key_shows_in_every_shape(world):
    made = _create(world, fairness_key="tenant-a")
    assert made["fairness_key"] == "tenant-a"
    assert "fair_at" not in made
    for shape in _shapes(world, made["id"]):
        assert shape["fairness_key"] == "tenant-a"
        assert "fair_at" not in shape
    job = Job.objects.get(id=made["id"])
    assert job.fairness_key == "tenant-a" and job.fair_at is not None
    # The bounds themselves, any printable characters, and a labelled job.
    for key in ("k" * 255, "a/b", "tenant 7", "50% off", "ключ", "."):
        assert _create(world, fairness_key=key)["fairness_key"] == key
    r = world.producer().post("jobs", json={"labels": ["gpu"], "fairness_key": "gpu-tenant"})
    assert r.status_code == 201, r.content
    assert r.json()["fairness_key"] == "gpu-tenant"
    # With the other flow-control keys too: all are kept.
    every = _create(world, fairness_key="t", rate_limit_key="api", concurrency_key="api",
                    concurrency_limit=2)
    assert (every["fairness_key"], every["rate_limit_key"], every["concurrency_key"]) == (
        "t", "api", "api")


def test_a_plain_job_shows_null(world):
    made = _create(world)
    assert made["fairness_key"] is None
    for shape in _shapes(world, made["id"]):
        assert shape["fairness_key"] is None
    assert _create(world, fairness_key=None)["fairness_key"] is None
    assert not Job.objects.filter(fair_at__isnull=False).exists()


# (A NUL anywhere in a body is refused before any field is read: docs/api.md, "Times".)
BAD_KEYS = ["", "k" * 256, "new\nline", "tab\there", "bell\x07", "\u2028", 7, 2.5, True,
            ["k"], {"k": 1}]


@pytest.mark.parametrize("key", BAD_KEYS)
def test_a_bad_key_is_a_400_naming_the_field_and_nothing_is_created(world, key):
    r = world.producer().post("jobs", json={"job_agent_id": str(world.agent.id),
                                            "fairness_key": key})
    assert r.status_code == 400, r.content
    assert r.json()["code"] == "validation_error" and "fairness_key" in r.json()["fields"]
    assert not Job.objects.exists()


def test_an_idempotent_replay_counts_the_key_as_sent(world):
    producer = world.producer()
    body = {"job_agent_id": str(world.agent.id), "fairness_key": "k"}
    key = {"Idempotency-Key": "fair-1"}
    first = producer.post("jobs", json=body, headers=key)
    assert first.status_code == 201, first.content
    again = producer.post("jobs", json=body, headers=key)
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    assert again.json()["fairness_key"] == "k"
    for other in ({**body, "fairness_key": "other"}, {"job_agent_id": str(world.agent.id)}):
        assert producer.post("jobs", json=other, headers=key).status_code == 422
    assert Job.objects.count() == 1


def test_a_flow_takes_it_per_job_and_places_them(world):
    agent = str(world.agent.id)
    r = world.producer().post("flows", json={"jobs": [
        {"ref": "a", "job_agent_id": agent, "fairness_key": "tenant"},
        {"ref": "b", "job_agent_id": agent, "fairness_key": "a/b c%",
         "depends_on_refs": ["a"]},
        {"ref": "c", "labels": ["gpu"], "fairness_key": "tenant"},
        {"ref": "d", "job_agent_id": agent},
        {"ref": "e", "job_agent_id": agent, "fairness_key": "tenant"},
    ]})
    assert r.status_code == 201, r.content
    jobs = r.json()["jobs"]
    assert {ref: j["fairness_key"] for ref, j in jobs.items()} == {
        "a": "tenant", "b": "a/b c%", "c": "tenant", "d": None, "e": "tenant"}
    assert all("fair_at" not in j for j in jobs.values())
    stored = {job.id: job for job in Job.objects.all()}
    by_ref = {ref: stored[uuid.UUID(j["id"])] for ref, j in jobs.items()}
    assert {ref: job.fairness_key for ref, job in by_ref.items()} == {
        "a": "tenant", "b": "a/b c%", "c": "tenant", "d": None, "e": "tenant"}
    # Each keyed job has its place; the flow's jobs of one key on one route (the agent's own
    # jobs; the labelled one is claimed from another queue) one place apart, in order.
    assert by_ref["d"].fair_at is None
    assert by_ref["b"].fair_at is not None and by_ref["c"].fair_at is not None
    assert by_ref["e"].fair_at - by_ref["a"].fair_at == fairness.STEP


def test_a_flows_jobs_of_a_weighted_key_follow_its_queued_ones(world):
    fairness.set_weight(world.workspace.id, "heavy", 4)
    first = Job.objects.get(id=_create(world, fairness_key="heavy")["id"])
    r = world.producer().post("flows", json={"jobs": [
        {"ref": ref, "job_agent_id": str(world.agent.id), "fairness_key": "heavy"}
        for ref in ("x", "y")]})
    assert r.status_code == 201, r.content
    x, y = (Job.objects.get(id=r.json()["jobs"][ref]["id"]).fair_at for ref in "xy")
    assert x - first.fair_at == fairness.STEP / 4 and y - x == fairness.STEP / 4


@pytest.mark.parametrize("key, field", [
    ("", "0: fairness_key"),
    ("k" * 256, "0: fairness_key"),
    (7, "0: fairness_key"),
    (True, "0: fairness_key"),
    ("new\nline", "jobs[1].fairness_key"),
    ("bell\x07", "jobs[1].fairness_key"),
])
def test_a_bad_flow_job_is_400_naming_the_field_and_nothing_is_made(world, key, field):
    """A key the body's shape refuses is named within `jobs` ("1: fairness_key: ..."), one
    the lifecycle's rule refuses as jobs[1].fairness_key; either way, no job of the flow."""
    agent = str(world.agent.id)
    r = world.producer().post("flows", json={"jobs": [
        {"ref": "ok", "job_agent_id": agent, "fairness_key": "fine"},
        {"ref": "bad", "job_agent_id": agent, "fairness_key": key}]})
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
    r = producer.post("schedules", json=_schedule(world, fairness_key="tenant-7"))
    assert r.status_code == 201, r.content
    schedule = r.json()
    assert schedule["job"]["fairness_key"] == "tenant-7"
    assert producer.get(f"schedules/{schedule['id']}").json()["job"] == schedule["job"]
    # A trigger's job and a fire's job.
    triggered = producer.post(f"schedules/{schedule['id']}/trigger")
    assert triggered.status_code == 201, triggered.content
    assert triggered.json()["fairness_key"] == "tenant-7"
    when = db_now().replace(microsecond=0) - dt.timedelta(seconds=30)
    Schedule.objects.filter(id=schedule["id"]).update(next_fire_at=when)
    service.run_once()
    fired = Job.objects.get(scheduled_for=when)
    assert fired.fairness_key == "tenant-7" and fired.fair_at is not None
    # A new job body with another key; then one without: plain jobs.
    r = producer.request("PATCH", f"schedules/{schedule['id']}",
                         json_body={"job": {"job_agent_id": str(world.agent.id),
                                            "fairness_key": "other"}})
    assert r.status_code == 200, r.content
    assert producer.post(f"schedules/{schedule['id']}/trigger").json()["fairness_key"] == (
        "other")
    plain = producer.post("schedules", json={**_schedule(world), "name": "plain"}).json()
    assert "fairness_key" not in plain["job"]
    assert producer.post(f"schedules/{plain['id']}/trigger").json()["fairness_key"] is None


@pytest.mark.parametrize("key", ["", "k" * 256, "new\nline", 7, True])
def test_a_bad_schedule_job_is_400_naming_job_and_nothing_is_made(world, key):
    producer = world.producer()
    r = producer.post("schedules", json=_schedule(world, fairness_key=key))
    assert r.status_code == 400, r.content
    body = r.json()
    assert body["code"] == "validation_error" and "job" in body["fields"], body
    assert body["fields"]["job"][0].startswith("fairness_key"), body
    assert not Schedule.objects.exists() and not Job.objects.exists()
    # The same job as a change of an existing schedule: refused, nothing changed.
    schedule_id = producer.post("schedules", json=_schedule(world)).json()["id"]
    before = list(Schedule.objects.values())
    r = producer.request("PATCH", f"schedules/{schedule_id}",
                         json_body={"job": _schedule(world, fairness_key=key)["job"]})
    assert r.status_code == 400, r.content
    assert "job" in r.json()["fields"]
    assert list(Schedule.objects.values()) == before


# --- PUT / GET / DELETE fairness-keys/{key}, GET fairness-keys -----------------------------


def test_set_read_replace_and_delete_a_weight(world):
    producer = world.producer()
    r = producer.put("fairness-keys/tenant-a", json={"weight": 10})
    assert r.status_code == 200, r.content
    made = r.json()
    assert set(made) == WEIGHT_FIELDS
    assert (made["key"], made["weight"]) == ("tenant-a", 10)
    assert made["created_at"] and made["updated_at"]
    got = producer.get("fairness-keys/tenant-a")
    assert got.status_code == 200 and got.json() == made
    # A PUT again replaces it: the same row, its created_at kept.
    r = producer.put("fairness-keys/tenant-a", json={"weight": 3})
    assert r.status_code == 200, r.content
    replaced = r.json()
    assert replaced["weight"] == 3
    assert replaced["created_at"] == made["created_at"]
    assert replaced["updated_at"] >= made["updated_at"]
    assert FairnessKey.objects.count() == 1
    assert producer.get("fairness-keys/tenant-a").json() == replaced
    # DELETE: 204 without a body; then there is none: GET and DELETE answer 404.
    r = producer.delete("fairness-keys/tenant-a")
    assert r.status_code == 204 and r.content == b""
    assert not FairnessKey.objects.exists()
    for method in ("GET", "DELETE"):
        r = producer.request(method, "fairness-keys/tenant-a")
        assert r.status_code == 404, (method, r.content)
        assert r.json() == {"code": "not_found", "detail": "No weight set for this key."}


@pytest.mark.parametrize("weight", [1, 100])
def test_the_bounds_themselves_are_taken(world, weight):
    r = world.producer().put("fairness-keys/k", json={"weight": weight})
    assert r.status_code == 200, r.content
    assert r.json()["weight"] == weight


KEYS = ["a/b", "tenant 7", "50% off", "a/", "/lead", "a//b", "?x=1#frag", ".", "..",
        "a/../b", "ключ", "k" * 255]


@pytest.mark.parametrize("key", KEYS)
def test_a_key_of_any_printable_characters_is_addressed_percent_encoded(world, key):
    producer = world.producer()
    r = producer.put(_path(key), json={"weight": 2})
    assert r.status_code == 200, r.content
    assert r.json()["key"] == key
    assert FairnessKey.objects.get().key == key
    assert producer.get(_path(key)).json()["key"] == key
    [listed] = producer.get("fairness-keys").json()["results"]
    assert listed["key"] == key
    assert producer.delete(_path(key)).status_code == 204
    assert not FairnessKey.objects.exists()


def test_a_slash_may_be_sent_as_it_is_and_a_space_or_percent_encoded(world):
    producer = world.producer()
    assert producer.put("fairness-keys/a/b", json={"weight": 1}).status_code == 200
    assert producer.get("fairness-keys/a%2Fb").json()["key"] == "a/b"
    assert producer.put("fairness-keys/tenant%207", json={"weight": 1}).status_code == 200
    assert producer.put("fairness-keys/50%25%20off", json={"weight": 1}).status_code == 200
    assert sorted(FairnessKey.objects.values_list("key", flat=True)) == [
        "50% off", "a/b", "tenant 7"]
    # "a" is not "a/b": a key is the whole rest of the path.
    assert producer.get("fairness-keys/a").status_code == 404


BAD_PATH_KEYS = ["k" * 256, "new%0Aline", "tab%09here", "nul%00", "del%7F", "%C2%85"]


@pytest.mark.parametrize("key", BAD_PATH_KEYS)
def test_a_bad_key_in_the_path_is_a_400_and_nothing_changes(world, key):
    producer = world.producer()
    fairness.set_weight(world.workspace.id, "kept", 5)
    before = _weights()
    for method, body in (("PUT", {"weight": 1}), ("GET", None), ("DELETE", None)):
        r = producer.request(method, f"fairness-keys/{key}", json_body=body)
        assert r.status_code == 400, (method, r.content)
        assert r.json()["code"] == "validation_error", r.content
        assert list(r.json()["fields"]) == ["key"], r.content
        assert _weights() == before


def test_no_key_is_a_404_of_the_router(world):
    r = world.producer().get("fairness-keys/")
    assert r.status_code == 404 and r.json()["code"] == "not_found"


@pytest.mark.parametrize("body, field", [
    ({}, "weight"),
    ({"weight": None}, "weight"),
    ({"weight": 0}, "weight"),
    ({"weight": -1}, "weight"),
    ({"weight": 101}, "weight"),
    ({"weight": 2**40}, "weight"),
    ({"weight": "5"}, "weight"),
    ({"weight": 5.0}, "weight"),
    ({"weight": True}, "weight"),
    ({"weight": [5]}, "weight"),
    ({"weight": 5, "share": 2}, "share"),
    ({"count": 5, "period_seconds": 60}, "weight"),
])
def test_a_bad_body_is_a_400_naming_the_field_and_changes_nothing(world, body, field):
    producer = world.producer()
    fairness.set_weight(world.workspace.id, "k", 5)
    before = _weights()
    r = producer.put("fairness-keys/k", json=body)
    assert r.status_code == 400, r.content
    assert r.json()["code"] == "validation_error" and field in r.json()["fields"], r.content
    assert _weights() == before
    # Nor is a weight made for a key that had none.
    assert producer.put("fairness-keys/new", json=body).status_code == 400
    assert _weights() == before


def test_a_body_that_is_not_an_object_or_not_json_is_refused(world):
    producer = world.producer()
    for raw, ctype, status in ((b"[1, 2]", "application/json", 400),
                               (b"{", "application/json", 400),
                               (b"", "application/json", 400),
                               (b"weight=1", "application/x-www-form-urlencoded", 415)):
        r = producer.request("PUT", "fairness-keys/k", raw=raw, content_type=ctype)
        assert r.status_code == status, (raw, r.content)
    assert not FairnessKey.objects.exists()


def test_a_bounds_message_names_the_bounds(world):
    r = world.producer().put("fairness-keys/k", json={"weight": 0})
    assert r.json()["fields"] == {"weight": ["Must be an integer from 1 to 100."]}


def test_patch_and_post_are_not_allowed(world):
    producer = world.producer()
    fairness.set_weight(world.workspace.id, "k", 5)
    before = _weights()
    for method, path in (("PATCH", "fairness-keys/k"), ("POST", "fairness-keys/k"),
                         ("POST", "fairness-keys"), ("DELETE", "fairness-keys"),
                         ("PUT", "fairness-keys")):
        r = producer.request(method, path, json_body={"weight": 1})
        assert r.status_code == 405 and r.json()["code"] == "method_not_allowed", (method, path)
    assert _weights() == before


def test_the_list_is_by_key_page_after_page_and_the_workspaces_own(world):
    producer = world.producer()
    keys = ["e", "c", "a", "d", "b"]
    for n, key in enumerate(keys, start=1):
        assert producer.put(f"fairness-keys/{key}", json={"weight": n}).status_code == 200
    fairness.set_weight(world.other_workspace.id, "a", 99)  # another workspace's
    fairness.set_weight(world.other_workspace.id, "zz-other", 99)
    page = producer.get("fairness-keys").json()
    assert [item["key"] for item in page["results"]] == ["a", "b", "c", "d", "e"]
    assert page["results"][0]["weight"] == 3
    assert all(set(item) == WEIGHT_FIELDS for item in page["results"])
    assert page["next"] is None and page["previous"] is None
    seen, url = [], "fairness-keys?page_size=2"
    while url:
        page = producer.get(url).json()
        assert len(page["results"]) <= 2
        seen += [item["key"] for item in page["results"]]
        url = page["next"] and "fairness-keys?" + page["next"].split("?", 1)[1]
    assert seen == ["a", "b", "c", "d", "e"]
    # Back one page from the last.
    last = producer.get("fairness-keys?page_size=2").json()
    last = producer.get("fairness-keys?" + last["next"].split("?", 1)[1]).json()
    back = producer.get("fairness-keys?" + last["previous"].split("?", 1)[1]).json()
    assert [item["key"] for item in back["results"]] == ["a", "b"]
    for bad in ("cursor=nonsense", "page_size=0", "page_size=501"):
        r = producer.get(f"fairness-keys?{bad}")
        assert r.status_code == 400 and r.json()["code"] == "validation_error", bad


def test_a_cursor_of_another_listing_is_refused(world):
    """Not even the rate limits' (the same pagination, by key)."""
    producer = world.producer()
    for key in ("a", "b"):
        assert producer.put(f"rate-limits/{key}",
                            json={"count": 1, "period_seconds": 1}).status_code == 200
    nxt = producer.get("rate-limits?page_size=1").json()["next"]
    r = producer.get("fairness-keys?" + nxt.split("?", 1)[1])
    assert r.status_code == 400 and "cursor" in r.json()["fields"]


def test_a_workspaces_weights_are_its_own(world):
    producer = world.producer()
    fairness.set_weight(world.other_workspace.id, "shared", 7)
    assert producer.get("fairness-keys/shared").status_code == 404
    assert producer.delete("fairness-keys/shared").status_code == 404
    assert producer.put("fairness-keys/shared", json={"weight": 1}).json()["weight"] == 1
    assert fairness.get_weight(world.other_workspace.id, "shared").weight == 7
    assert fairness.get_weight(world.workspace.id, "shared").weight == 1
    # The other workspace in the path: 404, nothing changed.
    before = _weights()
    other = f"/v1/workspaces/{world.other_workspace.id}/fairness-keys/shared"
    for method, body in (("PUT", {"weight": 2}), ("GET", None), ("DELETE", None)):
        r = producer.request(method, other, json_body=body)
        assert r.status_code == 404 and r.json()["code"] == "not_found", method
    assert _weights() == before


def _claim_next(world):
    r = world.agent_caller().post(f"job-agents/{world.agent.id}/jobs/claim")
    assert r.status_code == 200, r.content
    return r.json()["job"]["id"]


def test_a_weight_set_over_http_shares_the_claims_and_its_delete_evens_them(world):
    """Key a has 6 jobs queued, then key b 2: with b's weight 100, b's jobs are claimed
    right after a's first; with no weight (its delete), one for one."""
    a = [_create(world, fairness_key="a")["id"] for _ in range(6)]
    assert world.producer().put("fairness-keys/b", json={"weight": 100}).status_code == 200
    b = [_create(world, fairness_key="b")["id"] for _ in range(2)]
    assert [_claim_next(world) for _ in range(3)] == [a[0], *b]
    # Again, b's weight removed: its jobs take one place each among a's.
    b = [_create(world, fairness_key="b")["id"] for _ in range(2)]
    assert world.producer().delete("fairness-keys/b").status_code == 204
    order = [_claim_next(world) for _ in range(7)]
    assert set(order) == {*a[1:], *b}
    assert max(order.index(job) for job in b) <= 4  # not after all of a's
