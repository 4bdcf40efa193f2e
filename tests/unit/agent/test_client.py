"""The client library without a server: how answers map to typed errors and results, and what
each method sends. A `Server` transport stands in for the service (httpx.MockTransport); the
same client against the real server is in tests/e2e/test_agent_http.py."""

import datetime as dt
import json

import httpx
import pytest
from jobqueue_client import client as api

from tests.unit.agent.scripted import ScriptedServer

JOB = {"id": "j1", "attempt": 2, "job_agent_config": {"command": ["true"]},
       "dispatch_context": {"password": "hunter2"}}
CLAIM = {"claim_id": "c1", "attempt": 2, "lease_seconds": 30, "heartbeat_interval_seconds": 10,
         "claim_expires_at": "2030-01-01T00:00:30Z", "server_time": "2030-01-01T00:00:00Z"}


class Server(ScriptedServer):
    """Records (method, path, json body) of each request."""

    def __init__(self, *answers):
        super().__init__(*answers)
        self.seen = []

    def record(self, request: httpx.Request) -> None:
        raw = request.content
        self.seen.append((request.method, request.url.path, json.loads(raw) if raw else None))


def make(*answers):
    server = Server(*answers)
    return api.AgentClient("http://jq.test/", "ws", "ag", "jqa_0123456789ab_secret",
                           transport=httpx.MockTransport(server), holder="",
                           claim_sends=1), server


def response(status, body=None, headers=None, raw=None):
    if raw is not None:
        return httpx.Response(status, content=raw, headers=headers or {})
    return httpx.Response(status, json=body, headers=headers or {})


# --- error mapping -----------------------------------------------------------------------


@pytest.mark.parametrize(("status", "code", "cls"), [
    (500, "server_error", api.ServerError),
    (503, "unavailable", api.ServerError),
    (408, "timeout", api.ServerError),
    (429, "throttled", api.Throttled),
    (401, "authentication_failed", api.AuthError),
    (403, "permission_denied", api.AuthError),
    (404, "not_found", api.NotFound),
    (409, "claim_superseded", api.LeaseLost),
    (409, "lease_expired", api.LeaseLost),
    (409, "job_cancelled", api.LeaseLost),
    (409, "job_finished", api.LeaseLost),
    (409, "deadline_exceeded", api.DeadlineExceeded),
    (409, "job_not_claimable", api.NotClaimable),
    (409, "agent_paused", api.NotClaimable),
    (409, "invalid_transition", api.Conflict),
    (409, "effect_already_committed", api.EffectAlreadyCommitted),
    (409, "effect_not_begun", api.EffectNotBegun),
    (400, "validation_error", api.InvalidRequest),
    (413, "payload_too_large", api.InvalidRequest),
    (415, "unsupported_media_type", api.InvalidRequest),
    (422, "idempotency_key_reused", api.InvalidRequest),
])
def test_each_answer_becomes_its_typed_error_with_the_servers_code(status, code, cls):
    err = api.error_from_response(response(status, {"code": code, "detail": "why",
                                                    "fields": {"f": ["bad"]}}))
    assert type(err) is cls
    assert (err.status, err.code, err.detail, err.fields) == (status, code, "why", {"f": ["bad"]})
    assert err.transient == (status >= 500 or status in (408, 429))
    assert str(err) == f"{status} {code}: why"


@pytest.mark.parametrize(("status", "code"), [
    (400, "validation_error"), (401, "not_authenticated"), (403, "permission_denied"),
    (404, "not_found"), (405, "method_not_allowed"), (409, "conflict"),
    (413, "payload_too_large"), (415, "unsupported_media_type"), (429, "throttled"),
    (502, "server_error"), (418, "http_418"),
])
def test_an_answer_without_a_json_body_gets_a_code_from_its_status(status, code):
    err = api.error_from_response(response(status, raw=b"<html>proxy error</html>"))
    assert err.code == code and err.fields == {}
    assert err.detail == httpx.codes.get_reason_phrase(status)


def test_a_json_body_that_is_not_an_object_or_has_odd_fields_is_tolerated():
    err = api.error_from_response(response(409, ["not", "an", "object"]))
    assert type(err) is api.Conflict and err.code == "conflict"
    err = api.error_from_response(response(400, {"code": "validation_error", "fields": "x"}))
    assert err.fields == {} and err.detail == "Bad Request"


@pytest.mark.parametrize(("header", "seconds"), [
    ("3", 3.0), ("0.5", 0.5), ("-2", 0.0), ("soon", None), ("", None), (None, None),
])
def test_retry_after_is_read_as_seconds(header, seconds):
    headers = {"Retry-After": header} if header is not None else {}
    err = api.error_from_response(response(429, {"code": "throttled", "detail": "x"}, headers))
    assert err.retry_after == seconds


def test_a_transport_error_is_transient_and_carries_no_status():
    err = api.TransportError("ConnectError: refused")
    assert (err.status, err.code, err.transient) == (0, "network_error", True)
    assert str(err) == "network_error: ConnectError: refused"


# --- results -----------------------------------------------------------------------------


def test_parse_time_reads_z_offsets_and_naive_values_as_utc():
    utc = dt.datetime(2030, 1, 1, 12, 0, tzinfo=dt.UTC)
    assert api.parse_time("2030-01-01T12:00:00Z") == utc
    assert api.parse_time("2030-01-01T14:00:00+02:00") == utc
    assert api.parse_time("2030-01-01T12:00:00") == utc


def test_claim_from_payload_and_its_defaults():
    claim = api.Claim.from_payload({"job": JOB, "claim": CLAIM})
    assert (claim.job_id, claim.claim_id, claim.attempt, claim.lease_seconds) == \
        ("j1", "c1", 2, 30)
    assert claim.heartbeat_interval_seconds == 10.0 and claim.lease_remaining == 30.0
    assert "hunter2" not in repr(claim) and repr(claim) == "Claim(job_id='j1', attempt=2)"
    # An older server: no attempt, interval or server_time in the claim.
    bare = api.Claim.from_payload({"job": JOB, "claim": {
        "claim_id": "c1", "lease_seconds": 30, "claim_expires_at": "2030-01-01T00:00:30Z"}})
    assert bare.attempt == 2  # the job's
    assert bare.heartbeat_interval_seconds == 10.0  # lease / 3
    assert bare.lease_remaining == 0.0  # no server time: nothing to count on


def test_renewal_lease_remaining_needs_both_times():
    at = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    assert api.Renewal("j", True, at + dt.timedelta(seconds=9), at).lease_remaining == 9.0
    assert api.Renewal("j", False, code="lease_expired").lease_remaining == 0.0


# --- what the methods send and how they read the answers ---------------------------------


def test_requests_carry_the_token_and_the_workspace_path_and_repr_hides_the_token():
    c, server = make((200, {"results": [], "next": None}))
    with c:
        assert c.list_jobs(cursor="abc", page_size=5) == {"results": [], "next": None}
        assert "secret" not in repr(c) and repr(c) == \
            "AgentClient(server='http://jq.test', agent='ag')"
    assert server.seen == [("GET", "/v1/workspaces/ws/job-agents/ag/jobs", None)]


def test_claim_next_single_and_named():
    c, server = make((200, {"job": JOB, "claim": CLAIM}), (204, None),
                     (200, {"job": JOB, "claim": CLAIM}))
    assert c.claim_next().claim_id == "c1"
    assert c.claim_next() is None
    assert c.claim("j1").job_id == "j1"
    assert [(m, p, b) for m, p, b in server.seen] == [
        ("POST", "/v1/workspaces/ws/job-agents/ag/jobs/claim", {}),
        ("POST", "/v1/workspaces/ws/job-agents/ag/jobs/claim", {}),
        ("POST", "/v1/workspaces/ws/job-agents/ag/jobs/j1/claim", None),
    ]


def test_claim_batch_reads_every_shape_a_server_may_answer():
    c, server = make(
        (200, {"claims": [{"job": JOB, "claim": CLAIM}, {"job": JOB, "claim": CLAIM}]}),
        (204, None),
        (200, {"job": JOB, "claim": CLAIM}),  # a server that ignored "limit"
        (200, {"something": "else"}),
    )
    assert [x.claim_id for x in c.claim_batch(5)] == ["c1", "c1"]
    assert c.claim_batch(5) == []
    assert [x.job_id for x in c.claim_batch(5)] == ["j1"]
    with pytest.raises(api.ServerError) as exc:
        c.claim_batch(5)
    assert exc.value.code == "invalid_response"
    assert server.seen[0][2] == {"limit": 5}


@pytest.mark.parametrize("call", [
    lambda c: c.claim_batch(3),
    lambda c: c.heartbeat_batch([("j1", "c1")]),
    lambda c: c.report_batch([{"job_id": "j1", "claim_id": "c1", "status": "successful"}]),
])
@pytest.mark.parametrize("status", [404, 405])
def test_a_missing_batch_endpoint_is_unsupported(call, status):
    c, _ = make((status, {"code": "not_found", "detail": "no"}))
    with pytest.raises(api.Unsupported) as exc:
        call(c)
    assert exc.value.status == status


@pytest.mark.parametrize("call", [
    lambda c: c.claim_batch(3),
    lambda c: c.heartbeat_batch([("j1", "c1")]),
    lambda c: c.report_batch([{"job_id": "j1", "claim_id": "c1", "status": "successful"}]),
])
@pytest.mark.parametrize(("status", "cls"), [
    (400, api.InvalidRequest), (401, api.AuthError), (500, api.ServerError),
])
def test_other_refusals_of_a_batch_endpoint_are_raised_as_they_are(call, status, cls):
    c, _ = make((status, {"code": "some_code", "detail": "x"}))
    with pytest.raises(cls) as exc:
        call(c)
    assert not isinstance(exc.value, api.Unsupported) and exc.value.code == "some_code"


def test_heartbeat_single_and_batch():
    c, server = make(
        (200, {"job_id": "j1", "claim_expires_at": "2030-01-01T00:00:30Z",
               "server_time": "2030-01-01T00:00:00Z"}),
        (200, {"server_time": "2030-01-01T00:00:00Z", "results": [
            {"job_id": "j1", "renewed": True, "claim_expires_at": "2030-01-01T00:00:20Z"},
            {"job_id": "j2", "renewed": False, "code": "lease_expired"},
            {"job_id": "j3", "renewed": False},
        ]}),
        (200, {"results": [{"job_id": "j1", "renewed": True,
                            "claim_expires_at": "2030-01-01T00:00:20Z"}]}),
    )
    one = c.heartbeat("j1", "c1", timeout=2)
    assert one.renewed and one.lease_remaining == 30.0
    many = c.heartbeat_batch([("j1", "c1"), ("j2", "c2"), ("j3", "c3")])
    assert [(r.job_id, r.renewed, r.code, r.lease_remaining) for r in many] == [
        ("j1", True, "", 20.0), ("j2", False, "lease_expired", 0.0),
        ("j3", False, "claim_superseded", 0.0),
    ]
    [no_clock] = c.heartbeat_batch([("j1", "c1")])
    assert no_clock.renewed and no_clock.server_time is None and no_clock.lease_remaining == 0.0
    assert server.seen[0] == ("POST", "/v1/workspaces/ws/jobs/j1/heartbeat", {"claim_id": "c1"})
    assert server.seen[1][2] == {"claims": [{"job_id": "j1", "claim_id": "c1"},
                                            {"job_id": "j2", "claim_id": "c2"},
                                            {"job_id": "j3", "claim_id": "c3"}]}


def test_report_sends_only_what_it_was_given():
    c, server = make((200, {"id": "j1", "status": "in_progress"}),
                     (200, {"id": "j1", "status": "successful"}))
    assert c.report("j1", "c1", "in_progress")["status"] == "in_progress"
    c.report("j1", "c1", "successful", message="ok", result={"n": 1}, external_id="x-1")
    assert [b for _, _, b in server.seen] == [
        {"claim_id": "c1", "status": "in_progress"},
        {"claim_id": "c1", "status": "successful", "message": "ok", "result": {"n": 1},
         "external_id": "x-1"},
    ]
    assert {(m, p) for m, p, _ in server.seen} == {("PUT", "/v1/workspaces/ws/jobs/j1/status")}


def test_report_retry_sends_retry_true():
    c, server = make((200, {"id": "j1", "status": "queued"}))
    assert c.report("j1", "c1", "failure", retry=True)["status"] == "queued"
    assert server.seen[0][2] == {"claim_id": "c1", "status": "failure", "retry": True}


def test_report_batch_maps_each_item_to_what_the_single_report_would_raise():
    c, server = make((200, {"results": [
        {"job_id": "j1", "accepted": True},
        {"job_id": "j2", "accepted": False, "code": "not_found"},
        {"job_id": "j3", "accepted": False, "code": "job_cancelled"},
        {"job_id": "j4", "accepted": False},
        {"job_id": "j5", "accepted": False, "code": "deadline_exceeded"},
    ]}))
    reports = [{"job_id": f"j{i}", "claim_id": "c", "status": "successful"} for i in range(1, 6)]
    out = c.report_batch(reports)
    assert out[0] is None
    assert type(out[1]) is api.NotFound and out[1].code == "not_found"
    assert type(out[2]) is api.LeaseLost and out[2].code == "job_cancelled"
    assert type(out[3]) is api.LeaseLost and out[3].code == "claim_superseded"
    assert type(out[4]) is api.DeadlineExceeded and isinstance(out[4], api.LeaseLost)
    assert server.seen == [("POST", "/v1/workspaces/ws/job-agents/ag/reports",
                            {"reports": reports})]


@pytest.mark.parametrize("body", [{"results": []}, {"results": "no"}, ["x"]])
def test_a_batch_report_answer_that_does_not_match_the_request_is_a_server_error(body):
    c, _ = make((200, body))
    with pytest.raises(api.ServerError) as exc:
        c.report_batch([{"job_id": "j1", "claim_id": "c1", "status": "successful"}])
    assert exc.value.code == "invalid_response"


def test_release_with_and_without_its_options():
    c, server = make((200, {"id": "j1", "status": "queued"}), (200, {"status": "queued"}))
    assert c.release("j1", "c1")["status"] == "queued"
    c.release("j1", "c1", reason="shutting down", retry_after_seconds=7.9)
    assert [b for _, _, b in server.seen] == [
        {"claim_id": "c1"}, {"claim_id": "c1", "reason": "shutting down",
                             "retry_after_seconds": 7},
    ]


def test_an_answer_that_is_not_json_is_a_server_error():
    c, _ = make((200, b"<html>hello</html>"))
    with pytest.raises(api.ServerError) as exc:
        c.release("j1", "c1")
    assert (exc.value.status, exc.value.code) == (200, "invalid_response")


def test_network_failures_become_transport_errors():
    c, _ = make(httpx.ConnectError("refused"), httpx.ReadTimeout("slow"))
    with pytest.raises(api.TransportError) as exc:
        c.claim_next()
    assert exc.value.detail == "ConnectError: refused"
    with pytest.raises(api.TransportError) as exc:
        c.heartbeat("j1", "c1")
    assert exc.value.detail == "ReadTimeout: slow"


def test_errors_answered_by_the_server_are_raised_typed():
    c, _ = make((409, {"code": "lease_expired", "detail": "too late"}),
                (401, {"code": "authentication_failed", "detail": "who?"}))
    with pytest.raises(api.LeaseLost) as exc:
        c.heartbeat("j1", "c1")
    assert exc.value.code == "lease_expired"
    with pytest.raises(api.AuthError):
        c.list_jobs()


# --- holder, Idempotency-Key, reconciliation, checkpoints ---------------------------------


class HeaderServer(Server):
    def __call__(self, request):
        self.headers = getattr(self, "headers", [])
        self.headers.append(dict(request.headers))
        return super().__call__(request)


def make_recording(*answers, **kw):
    server = HeaderServer(*answers)
    return api.AgentClient("http://jq.test/", "ws", "ag", "jqa_0123456789ab_secret",
                           transport=httpx.MockTransport(server), **kw), server


def test_claims_carry_the_holder_and_a_lost_claim_answer_is_resent_with_the_same_key(
        monkeypatch):
    monkeypatch.setattr(api.time, "sleep", lambda s: None)
    client, server = make_recording(
        httpx.ReadTimeout("lost"), (502, {"code": "bad_gateway", "detail": "x"}),
        (200, {"job": JOB, "claim": {**CLAIM, "checkpoint": {"step": 2}}}),
        holder="host-1:77")
    claim = client.claim_next()
    assert claim.claim_id == "c1" and claim.checkpoint == {"step": 2}
    keys = {h["idempotency-key"] for h in server.headers}
    assert len(server.headers) == 3 and len(keys) == 1 and keys.pop().startswith("claim-")
    assert all(body == {"holder": "host-1:77"} for _, _, body in server.seen)
    # A new claim-next is a new key.
    server.answers.append((204, None))
    assert client.claim_next() is None
    assert server.headers[-1]["idempotency-key"] != server.headers[0]["idempotency-key"]


def test_a_claim_answer_lost_every_time_raises_after_the_last_send(monkeypatch):
    monkeypatch.setattr(api.time, "sleep", lambda s: None)
    client, server = make_recording(*[(503, {"code": "unavailable", "detail": "x"})] * 3)
    with pytest.raises(api.ServerError):
        client.claim_batch(2)
    assert len(server.seen) == api.CLAIM_SENDS
    assert all(body["limit"] == 2 for _, _, body in server.seen)


@pytest.mark.parametrize("how", ["claim_next", "claim_batch"])
def test_a_claim_key_whose_answers_were_all_lost_is_sent_again_until_one_is_answered(
        monkeypatch, how):
    # A restart of the server longer than the sends: the claim the first send may have made
    # is handed back by the next request (the same key), not left until its lease runs out.
    monkeypatch.setattr(api.time, "sleep", lambda s: None)
    lost = (503, {"code": "unavailable", "detail": "x"})
    client, server = make_recording(*[lost] * (2 * api.CLAIM_SENDS), (204, None), (204, None))
    claim = getattr(client, how)
    args = (2,) if how == "claim_batch" else ()
    for _ in range(2):
        with pytest.raises(api.ServerError):
            claim(*args)
    claim(*args)  # answered
    keys = [h["idempotency-key"] for h in server.headers]
    assert len(set(keys[:-1])) == 1 and len(keys) == 2 * api.CLAIM_SENDS + 1
    # Answered, the key is spent: the next claim request has a new one.
    claim(*args)
    assert server.headers[-1]["idempotency-key"] != keys[0]
    # A request with another body does not take a lost key.
    client2, server2 = make_recording(*[lost] * api.CLAIM_SENDS, (204, None))
    with pytest.raises(api.ServerError):
        client2.claim_next()
    client2.claim_next(wait_seconds=5)
    assert server2.headers[-1]["idempotency-key"] != server2.headers[0]["idempotency-key"]


def test_the_default_holder_is_host_and_pid_and_empty_sends_none():
    import os

    client, server = make_recording((200, {"job": JOB, "claim": CLAIM}))
    assert client.holder.endswith(f":{os.getpid()}")
    quiet, server = make_recording((200, {"job": JOB, "claim": CLAIM}), holder="")
    quiet.claim("j1")
    assert server.seen == [("POST", "/v1/workspaces/ws/job-agents/ag/jobs/j1/claim", None)]


def test_a_named_claim_may_expect_an_attempt():
    client, server = make_recording((200, {"job": JOB, "claim": CLAIM}), holder="h:1")
    client.claim("j1", expected_attempt=1)
    assert server.seen[0][2] == {"holder": "h:1", "expected_attempt": 1}


def test_claim_state_and_a_heartbeat_with_a_checkpoint():
    state = {"current": False, "code": "job_finished", "final_status": "successful",
             "server_time": "2030-01-01T00:00:00Z"}
    client, server = make_recording(
        (200, state),
        (200, {"job_id": "j1", "claim_expires_at": "2030-01-01T00:00:30Z",
               "server_time": "2030-01-01T00:00:00Z"}))
    assert client.claim_state("j1", "c1") == state
    client.heartbeat("j1", "c1", checkpoint={"offset": 10})
    assert server.seen[0][:2] == ("GET", "/v1/workspaces/ws/jobs/j1/claims/c1")
    assert server.seen[1][2] == {"claim_id": "c1", "checkpoint": {"offset": 10}}


def test_an_empty_log_append_sends_no_range_and_answers_the_length():
    import httpx
    from jobqueue_client.client import AgentClient

    seen = []

    def server(request):
        seen.append(request)
        return httpx.Response(202, json={"attempt": 1, "length": 7})

    client = AgentClient("http://jq.test", "ws", "ag", "jqa_0123456789ab_s",
                         transport=httpx.MockTransport(server))
    assert client.append_log("j", "c", b"", 7) == 7
    assert "Content-Range" not in seen[0].headers
    assert seen[0].headers["X-Claim-Id"] == "c"
    client.close()


# --- versions and addresses --------------------------------------------------------------


def test_every_request_names_the_client_and_its_version():
    from jobqueue_client import ProducerClient, __version__

    sent = []

    def answer(request):
        sent.append(request.headers["User-Agent"])
        return httpx.Response(200, json={"results": [], "next": None})

    transport = httpx.MockTransport(answer)
    api.AgentClient("http://jq.test/", "ws", "ag", "jqa_0123456789ab_secret",
                    transport=transport, holder="").list_jobs()
    ProducerClient("http://jq.test/", "ws", "jqk_x", transport=transport).list_page()
    assert sent[0].startswith(f"jobqueue-agent jobqueue-client/{__version__} python/")
    assert sent[1].startswith(f"jobqueue-producer jobqueue-client/{__version__} python/")
    assert f"httpx/{httpx.__version__}" in sent[0]


def test_a_network_error_carries_the_address_it_tried():
    def refuse(request):
        raise httpx.ConnectError("Connection refused", request=request)

    client = api.AgentClient("http://jq.test:9/", "ws", "ag", "jqa_0123456789ab_secret",
                             transport=httpx.MockTransport(refuse), holder="")
    with pytest.raises(api.TransportError) as caught:
        client.list_jobs()
    assert caught.value.code == "network_error"
    assert caught.value.url.startswith("http://jq.test:9/v1/workspaces/ws/job-agents/ag/jobs")
    assert "secret" not in caught.value.url


# --- the effect ledger -----------------------------------------------------------------------


def test_an_effects_lost_answer_is_sent_again_and_its_begin_is_bound_to_commit(monkeypatch):
    monkeypatch.setattr(api.time, "sleep", lambda s: None)
    answer = {"state": "unknown", "effect_id": "e1", "attempt": 1}
    c, server = make(httpx.ReadError("lost"), (503, {"code": "unavailable"}), (200, answer),
                     (200, {**answer, "state": "committed", "attempt": 2, "result": [1]}))
    fx = c.begin_effect("j1", "c1", "charge-card")
    assert (fx.key, fx.state, fx.effect_id, fx.attempt, fx.result) == (
        "charge-card", "unknown", "e1", 1, None)
    assert server.seen == [("POST", "/v1/workspaces/ws/jobs/j1/effects/charge-card/begin",
                            {"claim_id": "c1"})] * 3
    assert fx.commit([1]) == [1] and fx.committed and fx.attempt == 2
    assert server.seen[-1] == ("PUT", "/v1/workspaces/ws/jobs/j1/effects/charge-card",
                               {"claim_id": "c1", "result": [1]})


def test_an_effect_is_not_sent_again_after_a_refusal_nor_more_than_three_times(monkeypatch):
    monkeypatch.setattr(api.time, "sleep", lambda s: None)
    c, server = make((409, {"code": "claim_superseded"}))
    with pytest.raises(api.LeaseLost):
        c.begin_effect("j1", "c1", "k")
    assert len(server.seen) == 1
    c, server = make(*[httpx.ConnectError("refused")] * 3)
    with pytest.raises(api.TransportError):
        c.commit_effect("j1", "c1", "k", None)
    assert len(server.seen) == api.EFFECT_SENDS == 3


@pytest.mark.parametrize("answer", [
    [], "started", {"effect_id": "e1", "attempt": 1},
    {"state": "begun", "effect_id": "e1", "attempt": 1},
    {"state": "started", "effect_id": None, "attempt": 1},
    {"state": "started", "effect_id": "", "attempt": 1},
    {"state": "started", "effect_id": "e1", "attempt": "1"},
    {"state": "started", "effect_id": "e1", "attempt": True},
    {"state": "started", "effect_id": "e1", "attempt": 0},
    {"state": "committed", "effect_id": "e1", "attempt": 1},  # committed without its result
])
def test_an_effect_answer_of_another_shape_is_the_clients_protocol_error(answer):
    """A 200/201 that is not {state (one of three), effect_id, attempt (an integer >= 1),
    result when committed}: invalid_response, as an unexpected claim body is, not an Effect
    whose state or attempt would mislead the caller."""
    c, server = make((201, answer), (200, answer))
    for call in (lambda: c.begin_effect("j1", "c1", "k"),
                 lambda: c.commit_effect("j1", "c1", "k", 1)):
        with pytest.raises(api.ServerError) as caught:
            call()
        assert caught.value.code == "invalid_response"
    assert len(server.seen) == 2  # not sent again: the answer came


@pytest.mark.parametrize("result", [float("nan"), float("inf"), [float("-inf")], {1j}])
def test_a_result_that_is_not_json_is_refused_without_a_request(result):
    """NaN / Infinity (Python's json writes them, no JSON reader takes them) or an object
    json cannot encode: InvalidRequest, not a ValueError or TypeError from the encoder."""
    c, server = make()
    with pytest.raises(api.InvalidRequest) as exc:
        c.commit_effect("j1", "c1", "k", result)
    assert exc.value.code == "invalid_request" and server.seen == []


@pytest.mark.parametrize("key", ["", ".", "..", "...", "a/b", "a b", "k" * 201, None])
def test_a_key_no_path_can_carry_is_refused_without_a_request(key):
    c, server = make()
    with pytest.raises(api.InvalidRequest) as exc:
        c.begin_effect("j1", "c1", key)
    assert exc.value.code == "validation_error" and "key" in exc.value.fields
    assert server.seen == []
    assert api.check_effect_key("a..b") == "a..b" and api.check_effect_key(".k") == ".k"
def test_a_transport_error_before_any_request_has_no_url():
    err = api.TransportError.of(httpx.ConnectError("no route"))
    assert err.url is None and "ConnectError: no route" in str(err)


def test_an_effect_not_bound_to_a_claim_cannot_commit():
    """commit_effect's answer (and effects.commit's) is the outcome: nothing left to commit."""
    fx = api.Effect("k", {"state": "committed", "effect_id": "e1", "attempt": 1, "result": 2})
    with pytest.raises(RuntimeError, match="not bound"):
        fx.commit(3)
    assert fx.result == 2
