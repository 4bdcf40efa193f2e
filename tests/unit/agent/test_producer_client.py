"""The producer client without a server: what each method sends, how answers map to typed
errors, which requests are sent again after a lost answer. An httpx.MockTransport stands in
for the service; the same client against the real server is tests/e2e/test_producer_client.py.
"""

import datetime as dt
import hashlib
import io
import json

import httpx
import pytest
from jobqueue_client import client as api
from jobqueue_client import producer as prod

from tests.unit.agent.scripted import ScriptedServer

KEY = "jqk_0123456789ab_secret"


class Server(ScriptedServer):
    """Records every request."""

    def __init__(self, *answers):
        super().__init__(*answers)
        self.seen: list[httpx.Request] = []

    def record(self, request: httpx.Request) -> None:
        self.seen.append(request)

    def bodies(self):
        return [json.loads(r.content) if r.content else None for r in self.seen]


def make(*answers, **options):
    server = Server(*answers)
    client = prod.ProducerClient("http://jq.test/", "ws", KEY,
                                 transport=httpx.MockTransport(server), **options)
    return client, server


JOB = {"id": "j1", "status": "queued"}


def test_it_sends_the_workspace_key_and_never_prints_it():
    client, server = make((200, JOB))
    client.get("j1")
    [request] = server.seen
    assert request.headers["X-API-Key"] == KEY and "Authorization" not in request.headers
    assert request.url.path == "/v1/workspaces/ws/jobs/j1"
    assert KEY not in repr(client)


def test_create_sends_only_what_was_given():
    client, server = make((201, JOB), (201, JOB))
    client.create_job("ag")
    when = dt.datetime(2030, 1, 2, 3, 4, 5)  # naive: taken as UTC
    client.create_job("ag", job_agent_config={"a": 1}, dispatch_context={"s": "x"},
                      priority=0, max_attempts=2, delay_seconds=0, retry_backoff_seconds=3,
                      max_runtime_seconds=60, expires_at=when, external_id="e", group="g",
                      hold=True)
    first, second = server.bodies()
    assert first == {"job_agent_id": "ag"}
    assert second == {"job_agent_id": "ag", "job_agent_config": {"a": 1},
                      "dispatch_context": {"s": "x"}, "priority": 0, "max_attempts": 2,
                      "delay_seconds": 0, "retry_backoff_seconds": 3,
                      "max_runtime_seconds": 60, "expires_at": "2030-01-02T03:04:05+00:00",
                      "external_id": "e", "group": "g", "hold": True}
    assert all("Idempotency-Key" not in r.headers for r in server.seen)


def test_create_sends_the_unique_key_and_its_options_when_given():
    deduplicated = {**JOB, "unique_key": "nightly", "deduplicated": True}
    client, server = make((200, deduplicated), (201, JOB))
    assert client.create_job("ag", unique_key="nightly", unique_states=("queued",),
                             on_conflict="replace", debounce_seconds=30,
                             debounce_max_seconds=300) == deduplicated
    client.create_job("ag", unique_key="other")
    first, second = server.bodies()
    assert first == {"job_agent_id": "ag", "unique_key": "nightly", "unique_states": ["queued"],
                     "on_conflict": "replace", "debounce_seconds": 30,
                     "debounce_max_seconds": 300}
    assert second == {"job_agent_id": "ag", "unique_key": "other"}


def test_create_sends_the_concurrency_key_and_limit_when_given():
    keyed = {**JOB, "concurrency_key": "deploy", "concurrency_limit": 2}
    client, server = make((201, keyed), (201, JOB), (201, JOB))
    assert client.create_job("ag", concurrency_key="deploy", concurrency_limit=2) == keyed
    client.create_job("ag", concurrency_key="deploy")
    client.create_job(labels=["gpu"], concurrency_key=None, concurrency_limit=None)
    first, second, third = server.bodies()
    assert first == {"job_agent_id": "ag", "concurrency_key": "deploy", "concurrency_limit": 2}
    assert second == {"job_agent_id": "ag", "concurrency_key": "deploy"}
    assert third == {"labels": ["gpu"]}


def test_create_sends_the_rate_limit_key_when_given():
    keyed = {**JOB, "rate_limit_key": "partner/api"}
    client, server = make((201, keyed), (201, JOB))
    assert client.create_job("ag", rate_limit_key="partner/api") == keyed
    client.create_job(labels=["gpu"], rate_limit_key=None)
    assert server.bodies() == [{"job_agent_id": "ag", "rate_limit_key": "partner/api"},
                               {"labels": ["gpu"]}]


LIMIT = {"key": "a/b", "count": 5, "period_seconds": 60, "created_at": "2030-01-01T00:00:00Z",
         "updated_at": "2030-01-01T00:00:00Z"}


@pytest.mark.parametrize(("key", "segment"), [
    ("partner", b"partner"), ("a/b", b"a%2Fb"), ("deploy prod", b"deploy%20prod"),
    ("50% off", b"50%25%20off"), (".", b"%2E"), ("..", b"%2E%2E"), ("v1.2", b"v1%2E2"),
    ("?x#y", b"%3Fx%23y"), ("ключ", b"%D0%BA%D0%BB%D1%8E%D1%87"),
])
def test_a_rate_limit_key_is_one_percent_encoded_path_segment(key, segment):
    client, server = make((200, LIMIT), (200, LIMIT), (204, None))
    client.set_rate_limit(key, 5, 60)
    client.get_rate_limit(key)
    client.delete_rate_limit(key)
    path = b"/v1/workspaces/ws/rate-limits/" + segment
    assert [(r.method, r.url.raw_path) for r in server.seen] == [
        ("PUT", path), ("GET", path), ("DELETE", path)]


def test_set_rate_limit_puts_the_limit_and_is_sent_again_after_a_lost_answer():
    client, server = make(httpx.ReadError("lost"), (502, b"bad gateway"), (200, LIMIT))
    assert client.set_rate_limit("a/b", 5, 60) == LIMIT
    assert server.bodies() == [{"count": 5, "period_seconds": 60}] * 3
    assert all(r.headers["Content-Type"] == "application/json" for r in server.seen)


def test_get_rate_limit_is_sent_again_and_a_missing_one_is_not_found():
    client, server = make(httpx.ConnectError("refused"), (200, LIMIT),
                          (404, {"code": "not_found", "detail": "No rate limit for this key."}))
    assert client.get_rate_limit("a/b") == LIMIT and len(server.seen) == 2
    with pytest.raises(api.NotFound):
        client.get_rate_limit("none")


def test_delete_rate_limit_is_sent_once():
    client, server = make((503, {"code": "server_error"}))
    with pytest.raises(api.ServerError):
        client.delete_rate_limit("a/b")
    assert len(server.seen) == 1 and server.seen[0].content == b""
    client, server = make((404, {"code": "not_found", "detail": "No rate limit for this key."}))
    with pytest.raises(api.NotFound):
        client.delete_rate_limit("a/b")


def test_a_refused_rate_limit_names_its_field():
    client, _ = make((400, {"code": "validation_error", "detail": "Invalid input.",
                            "fields": {"count": ["Must be an integer from 1 to 100000."]}}))
    with pytest.raises(api.InvalidRequest) as refused:
        client.set_rate_limit("k", 0, 60)
    assert refused.value.fields == {"count": ["Must be an integer from 1 to 100000."]}


def test_list_rate_limits_follows_the_cursor_and_stops_at_the_limit():
    pages = [
        (200, {"results": [{**LIMIT, "key": "a"}, {**LIMIT, "key": "b"}],
               "next": "http://elsewhere:9/v1/workspaces/ws/rate-limits?cursor=c1&page_size=2",
               "previous": None}),
        (200, {"results": [{**LIMIT, "key": "c"}], "next": None, "previous": "x"}),
    ]
    client, server = make(*pages)
    assert [item["key"] for item in client.list_rate_limits(page_size=2)] == ["a", "b", "c"]
    assert [(r.url.host, r.url.path) for r in server.seen] == [
        ("jq.test", "/v1/workspaces/ws/rate-limits")] * 2
    assert [dict(r.url.params) for r in server.seen] == [
        {"page_size": "2"}, {"page_size": "2", "cursor": "c1"}]
    client, server = make(pages[0])
    assert [item["key"] for item in client.list_rate_limits(limit=1)] == ["a"]
    assert len(server.seen) == 1
    client, server = make((200, {"results": [], "next": None, "previous": None}))
    assert list(client.list_rate_limits()) == [] and dict(server.seen[0].url.params) == {}


def test_create_sends_the_fairness_key_when_given():
    keyed = {**JOB, "fairness_key": "tenant/7"}
    client, server = make((201, keyed), (201, JOB))
    assert client.create_job("ag", fairness_key="tenant/7") == keyed
    client.create_job(labels=["gpu"], fairness_key=None)
    assert server.bodies() == [{"job_agent_id": "ag", "fairness_key": "tenant/7"},
                               {"labels": ["gpu"]}]


WEIGHT = {"key": "a/b", "weight": 5, "created_at": "2030-01-01T00:00:00Z",
          "updated_at": "2030-01-01T00:00:00Z"}


@pytest.mark.parametrize(("key", "segment"), [
    ("tenant", b"tenant"), ("a/b", b"a%2Fb"), ("tenant 7", b"tenant%207"),
    ("50% off", b"50%25%20off"), (".", b"%2E"), ("..", b"%2E%2E"),
    ("?x#y", b"%3Fx%23y"), ("ключ", b"%D0%BA%D0%BB%D1%8E%D1%87"),
])
def test_a_fairness_key_is_one_percent_encoded_path_segment(key, segment):
    client, server = make((200, WEIGHT), (200, WEIGHT), (204, None))
    client.set_fairness_weight(key, 5)
    client.get_fairness_weight(key)
    client.delete_fairness_weight(key)
    path = b"/v1/workspaces/ws/fairness-keys/" + segment
    assert [(r.method, r.url.raw_path) for r in server.seen] == [
        ("PUT", path), ("GET", path), ("DELETE", path)]


def test_set_fairness_weight_puts_it_and_is_sent_again_after_a_lost_answer():
    client, server = make(httpx.ReadError("lost"), (502, b"bad gateway"), (200, WEIGHT))
    assert client.set_fairness_weight("a/b", 5) == WEIGHT
    assert server.bodies() == [{"weight": 5}] * 3


def test_get_fairness_weight_is_sent_again_and_a_missing_one_is_not_found():
    missing = (404, {"code": "not_found", "detail": "No weight set for this key."})
    client, server = make(httpx.ConnectError("refused"), (200, WEIGHT), missing)
    assert client.get_fairness_weight("a/b") == WEIGHT and len(server.seen) == 2
    with pytest.raises(api.NotFound):
        client.get_fairness_weight("none")


def test_delete_fairness_weight_is_sent_once():
    client, server = make((503, {"code": "server_error"}))
    with pytest.raises(api.ServerError):
        client.delete_fairness_weight("a/b")
    assert len(server.seen) == 1 and server.seen[0].content == b""
    client, server = make((404, {"code": "not_found", "detail": "No weight set for this key."}))
    with pytest.raises(api.NotFound):
        client.delete_fairness_weight("a/b")


def test_a_refused_weight_names_its_field():
    client, _ = make((400, {"code": "validation_error", "detail": "Invalid input.",
                            "fields": {"weight": ["Must be an integer from 1 to 100."]}}))
    with pytest.raises(api.InvalidRequest) as refused:
        client.set_fairness_weight("k", 0)
    assert refused.value.fields == {"weight": ["Must be an integer from 1 to 100."]}


def test_list_fairness_keys_follows_the_cursor_and_stops_at_the_limit():
    pages = [
        (200, {"results": [{**WEIGHT, "key": "a"}, {**WEIGHT, "key": "b"}],
               "next": "http://elsewhere:9/v1/workspaces/ws/fairness-keys?cursor=c1&page_size=2",
               "previous": None}),
        (200, {"results": [{**WEIGHT, "key": "c"}], "next": None, "previous": "x"}),
    ]
    client, server = make(*pages)
    assert [item["key"] for item in client.list_fairness_keys(page_size=2)] == ["a", "b", "c"]
    assert [(r.url.host, r.url.path) for r in server.seen] == [
        ("jq.test", "/v1/workspaces/ws/fairness-keys")] * 2
    assert [dict(r.url.params) for r in server.seen] == [
        {"page_size": "2"}, {"page_size": "2", "cursor": "c1"}]
    client, server = make(pages[0])
    assert [item["key"] for item in client.list_fairness_keys(limit=1)] == ["a"]
    assert len(server.seen) == 1
    client, server = make((200, {"results": [], "next": None, "previous": None}))
    assert list(client.list_fairness_keys()) == [] and dict(server.seen[0].url.params) == {}


def test_a_keyed_create_is_sent_again_with_the_same_key_and_an_unkeyed_one_is_not():
    client, server = make(httpx.ReadError("lost"), (503, {"code": "server_error"}), (200, JOB))
    assert client.create_job("ag", idempotency_key="k-1") == JOB
    assert [r.headers["Idempotency-Key"] for r in server.seen] == ["k-1"] * 3
    assert len({r.content for r in server.seen}) == 1
    client, server = make(httpx.ReadError("lost"))
    with pytest.raises(api.TransportError):
        client.create_job("ag")
    assert len(server.seen) == 1  # a lost answer might have created it: not repeated


def test_a_cancel_is_sent_again_after_a_lost_answer():
    client, server = make(httpx.ReadError("lost"), (200, {"id": "j1", "status": "cancelled"}))
    assert client.cancel("j1", reason="stop")["status"] == "cancelled"
    assert server.bodies() == [{"reason": "stop"}] * 2


def test_other_writes_are_sent_once():
    for call in (lambda c: c.requeue("j1"), lambda c: c.dispatch("j1"),
                 lambda c: c.cancel_group("g")):
        client, server = make((503, {"code": "server_error"}))
        with pytest.raises(api.ServerError):
            call(client)
        assert len(server.seen) == 1


def test_reads_are_sent_again_after_a_lost_answer():
    client, server = make(httpx.ConnectError("refused"), (502, b"bad gateway"), (200, JOB))
    assert client.get("j1") == JOB and len(server.seen) == 3
    client, server = make(*[httpx.ConnectError("refused")] * 3, sends=3)
    with pytest.raises(api.TransportError):
        client.get("j1")
    assert len(server.seen) == 3


@pytest.mark.parametrize(("status", "code", "cls"), [
    (409, "job_finished", prod.JobFinished),
    (409, "group_cancelled", prod.GroupCancelled),
    (409, "invalid_transition", prod.InvalidTransition),
    (409, "unique_key_conflict", prod.UniqueKeyConflict),
    (409, "something_new", api.Conflict),
    (422, "idempotency_key_reused", prod.IdempotencyKeyReused),
    (404, "not_found", api.NotFound),
    (401, "authentication_failed", api.AuthError),
    (400, "validation_error", api.InvalidRequest),
    (429, "throttled", api.Throttled),
])
def test_error_answers_become_typed_errors(status, code, cls):
    client, _ = make((status, {"code": code, "detail": "no", "fields": {"x": ["bad"]}},
                      {"Retry-After": "2"}))
    with pytest.raises(cls) as caught:
        client.requeue("j1")
    assert (caught.value.status, caught.value.code, caught.value.detail) == (status, code, "no")
    assert caught.value.fields == {"x": ["bad"]}
    if status == 409:  # a producer holds no lease: never a LeaseLost
        assert isinstance(caught.value, api.Conflict)
        assert not isinstance(caught.value, api.LeaseLost)
    if status == 429:
        assert caught.value.retry_after == 2


def test_paths_are_percent_encoded_and_reasons_sent_when_given():
    client, server = make((200, {"group": "a b#?"}), (200, {"cancelled": 3}),
                          (200, {"cancelled": 0}))
    client.group("a b#?")
    assert client.cancel_group("a b#?", reason="stop") == 3
    assert client.cancel_group("a b#?") == 0
    assert server.seen[0].url.raw_path == b"/v1/workspaces/ws/groups/a%20b%23%3F"
    assert server.bodies()[1:] == [{"reason": "stop"}, {}]


def test_list_follows_only_the_cursor_of_next_and_stops_at_the_limit():
    pages = [
        (200, {"results": [{"id": "1"}, {"id": "2"}],
               "next": "http://elsewhere:9999/v1/workspaces/ws/jobs?cursor=c1&page_size=2",
               "previous": None}),
        (200, {"results": [{"id": "3"}], "next": None, "previous": "x"}),
    ]
    client, server = make(*pages)
    assert [j["id"] for j in client.list(status="queued", group="g", page_size=2)] == \
        ["1", "2", "3"]
    assert [r.url.host for r in server.seen] == ["jq.test", "jq.test"]
    assert [dict(r.url.params) for r in server.seen] == [
        {"status": "queued", "group": "g", "page_size": "2"},
        {"status": "queued", "group": "g", "page_size": "2", "cursor": "c1"}]
    client, server = make(pages[0])
    assert [j["id"] for j in client.list(limit=2)] == ["1", "2"] and len(server.seen) == 1


def test_read_log_reads_its_headers():
    client, server = make((200, b"line 2\n", {"X-Log-Attempt": "3", "X-Log-Length": "14",
                                              "Content-Type": "text/plain"}))
    chunk = client.read_log("j1", offset=7)
    assert (chunk.data, chunk.attempt, chunk.offset, chunk.length, chunk.next_offset) == (
        b"line 2\n", 3, 7, 14, 14)
    assert dict(server.seen[0].url.params) == {"offset": "7"}


def test_download_streams_checks_the_etag_and_leaves_nothing_on_a_mismatch(tmp_path):
    data = b"x" * (prod.DOWNLOAD_CHUNK + 10)
    etag = f'"{hashlib.sha256(data).hexdigest()}"'
    client, _ = make((200, data, {"ETag": etag}), (200, data, {"ETag": '"' + "0" * 64 + '"'}))
    out = io.BytesIO()
    assert client.download_artifact("j1", "a.bin", out)["size"] == len(data)
    assert out.getvalue() == data
    with pytest.raises(prod.ChecksumMismatch):
        client.download_artifact("j1", "a.bin", tmp_path / "a.bin")
    assert list(tmp_path.iterdir()) == []


def test_wait_retries_transient_errors_and_returns_the_ended_job(monkeypatch):
    monkeypatch.setattr(prod.time, "sleep", lambda s: None)
    client, server = make((503, {"code": "server_error"}), (503, {"code": "server_error"}),
                          (503, {"code": "server_error"}), (200, {"id": "j1", "status": "queued"}),
                          (200, {"id": "j1", "status": "expired"}), sends=1)
    assert client.wait("j1", poll_seconds=7)["status"] == "expired"
    assert [r.url.params.get("wait_seconds") for r in server.seen] == ["7"] * 5


def test_wait_raises_what_retrying_cannot_fix():
    client, _ = make((404, {"code": "not_found"}))
    with pytest.raises(api.NotFound):
        client.wait("j1", timeout=10)


def bad_wait(bound=1):
    return (400, {"code": "validation_error", "detail": "too long",
                  "fields": {"wait_seconds": [f"Must be at most {bound}."]}})


def test_a_wait_bound_below_one_second_is_raised_not_halved_again():
    client, server = make(bad_wait(), sends=1)
    with pytest.raises(api.InvalidRequest):
        client.wait("j1", poll_seconds=1)
    assert len(server.seen) == 1


def test_wait_pauses_as_long_as_a_throttling_server_asks(monkeypatch):
    pauses = []
    monkeypatch.setattr(prod.time, "sleep", pauses.append)
    client, _ = make((429, {"code": "throttled"}, {"Retry-After": "3"}),
                     (200, {"id": "j1", "status": "successful"}), sends=1)
    assert client.wait("j1", poll_seconds=5)["status"] == "successful"
    assert pauses == [3.0]


def test_wait_that_cannot_retry_before_its_deadline_raises_or_times_out(monkeypatch):
    monkeypatch.setattr(prod.time, "sleep", lambda s: None)
    # No answer yet: the error itself.
    client, _ = make((429, {"code": "throttled"}, {"Retry-After": "60"}), sends=1)
    with pytest.raises(api.Throttled):
        client.wait("j1", timeout=5)
    # The job was seen: WaitTimeout carries it.
    client, _ = make((200, {"id": "j1", "status": "queued"}),
                     (429, {"code": "throttled"}, {"Retry-After": "60"}), sends=1)
    with pytest.raises(prod.WaitTimeout) as caught:
        client.wait("j1", timeout=5, poll_seconds=1)
    assert caught.value.job == {"id": "j1", "status": "queued"}


def test_download_is_sent_again_until_its_body_starts(tmp_path, monkeypatch):
    monkeypatch.setattr(prod.time, "sleep", lambda s: None)
    data = b"artifact"
    client, server = make(httpx.ConnectError("lost"), (503, {"code": "server_error"}),
                          (200, data, {"ETag": f'"{hashlib.sha256(data).hexdigest()}"'}),
                          sends=3)
    assert client.download_artifact("j1", "a.bin", tmp_path / "a.bin")["size"] == len(data)
    assert (tmp_path / "a.bin").read_bytes() == data and len(server.seen) == 3
    client, _ = make(httpx.ConnectError("lost"), httpx.ConnectError("lost"), sends=2)
    with pytest.raises(api.TransportError):
        client.download_artifact("j1", "a.bin", tmp_path / "b.bin")


class BrokenBody(httpx.SyncByteStream):
    def __iter__(self):
        yield b"first part"
        raise httpx.ReadError("connection reset")


def test_a_body_cut_short_is_a_transport_error_and_leaves_no_file(tmp_path):
    def answer(status):
        return lambda request: httpx.Response(status, stream=BrokenBody())

    client = prod.ProducerClient("http://jq.test/", "ws", KEY, sends=1,
                                 transport=httpx.MockTransport(answer(200)))
    with pytest.raises(api.TransportError, match="ReadError: connection reset"):
        client.download_artifact("j1", "a.bin", tmp_path / "a.bin")
    assert list(tmp_path.iterdir()) == []
    # An error answer whose body is cut short: the same.
    client = prod.ProducerClient("http://jq.test/", "ws", KEY, sends=1,
                                 transport=httpx.MockTransport(answer(404)))
    with pytest.raises(api.TransportError, match="ReadError"):
        client.download_artifact("j1", "a.bin", tmp_path / "a.bin")


def test_create_sends_its_dependencies_and_a_flow_is_sent_once():
    client, server = make((201, {**JOB, "status": "pending"}))
    client.create_job("ag", depends_on=["p1", "p2"])
    assert server.bodies() == [{"job_agent_id": "ag", "depends_on": ["p1", "p2"]}]
    jobs = {"extract": {**JOB, "id": "e"}, "load": {**JOB, "id": "l", "status": "pending"}}
    flow = [{"ref": "extract", "job_agent_id": "ag"},
            {"ref": "load", "job_agent_id": "ag", "depends_on_refs": ["extract"]}]
    client, server = make((201, {"jobs": jobs}))
    assert client.create_flow(flow) == jobs
    assert server.bodies() == [{"jobs": flow}]
    assert server.seen[0].url.path.endswith("/workspaces/ws/flows")
    client, server = make(httpx.ReadError("lost"))
    with pytest.raises(api.TransportError):
        client.create_flow(flow)
    assert len(server.seen) == 1  # a lost answer might have created it: not repeated


def test_create_for_labels_sends_them_instead_of_an_agent_and_wants_exactly_one():
    client, server = make((201, {**JOB, "labels": ["gpu", "linux"]}))
    assert client.create_job(labels=("gpu", "linux"), priority=2)["labels"] == ["gpu", "linux"]
    assert server.bodies() == [{"labels": ["gpu", "linux"], "priority": 2}]
    for wrong in ({}, {"job_agent_id": "ag", "labels": ["gpu"]}):
        with pytest.raises(ValueError, match="exactly one of job_agent_id and labels"):
            client.create_job(**wrong)
    assert len(server.seen) == 1  # nothing sent


def test_explain_job_reads_why_a_job_is_not_running_and_retries_a_lost_answer():
    explanation = {"status": "queued", "claimable": True, "reasons": [],
                   "agents": {"matching": 1, "online": 1}}
    client, server = make((503, {"code": "unavailable", "detail": "x"}), (200, explanation))
    assert client.explain_job("j 1") == explanation
    assert [r.url.path for r in server.seen] == ["/v1/workspaces/ws/jobs/j 1/explain"] * 2
    assert server.seen[0].url.raw_path == b"/v1/workspaces/ws/jobs/j%201/explain"
