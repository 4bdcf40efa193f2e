"""The agent's loop against answers a real server gives only rarely (refusals, 413, lost
leases, failing batch endpoints, release errors), with an in-memory stand-in for the agent
API behind httpx.MockTransport. Child processes are real. The agent against the real server
is in tests/e2e/test_agent_http.py."""

import itertools
import json
import logging
import re
import threading
import time

import httpx
import pytest
from jobqueue_client import child, logstream, reports, runner
from jobqueue_client import client as api
from jobqueue_client.lease import Lease
from jobqueue_client.runner import Agent, AgentOptions

from tests.e2e.harness import wait_for

CLAIM_NEXT = re.compile(r"/job-agents/ag/jobs/claim$")
AGENT_HEARTBEAT = re.compile(r"/job-agents/ag/heartbeat$")
REPORTS = re.compile(r"/job-agents/ag/reports$")
HEARTBEAT = re.compile(r"/jobs/([^/]+)/heartbeat$")
STATUS = re.compile(r"/jobs/([^/]+)/status$")
RELEASE = re.compile(r"/jobs/([^/]+)/release$")
LOG = re.compile(r"/jobs/([^/]+)/log$")
ARTIFACT = re.compile(r"/jobs/([^/]+)/artifacts/([^/]+)$")


def stamp(seconds_from_now=0.0):
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() + seconds_from_now)) + "Z"


class Api:
    """Hands out `jobs` (each {"id", "command"}) one claim at a time, renews every lease,
    accepts every report and release; `rules` (first match wins) answer instead:
    rule(method, path, body) -> (status, json[, headers]), an exception to raise, or None.
    `holds` run first, outside the lock, and may block a request. Records every request."""

    def __init__(self, *commands, lease_seconds=30):
        self._ids = itertools.count(1)
        self.jobs = [{"id": f"job{next(self._ids)}", "command": c} for c in commands]
        self.lease_seconds = lease_seconds
        self.rules = []
        self.holds = []
        self.seen = []
        self.lock = threading.Lock()

    def add(self, *commands):
        with self.lock:
            self.jobs += [{"id": f"job{next(self._ids)}", "command": c} for c in commands]

    def _grant(self, job):
        return {"job": {"id": job["id"], "attempt": 1,
                        "job_agent_config": {"command": job["command"]},
                        "dispatch_context": {}},
                "claim": {"claim_id": f"claim-{job['id']}", "attempt": 1,
                          "lease_seconds": self.lease_seconds,
                          "heartbeat_interval_seconds": self.lease_seconds / 3,
                          "claim_expires_at": stamp(self.lease_seconds),
                          "server_time": stamp()}}

    def __call__(self, request):
        raw = request.read()
        if request.headers.get("Content-Type", "").startswith("application/json"):
            body = json.loads(raw) if raw else None
        else:  # a log chunk or an artifact: raw bytes
            body = raw or None
        method, path = request.method, request.url.path
        with self.lock:
            self.seen.append((method, path, body))
        for hold in self.holds:
            hold(method, path, body)
        with self.lock:
            for rule in self.rules:
                answer = rule(method, path, body)
                if answer is not None:
                    if isinstance(answer, Exception):
                        raise answer
                    status, payload, *headers = answer
                    return httpx.Response(status, json=payload,
                                          headers=headers[0] if headers else None)
            return self._default(method, path, body)

    def _default(self, method, path, body):
        if CLAIM_NEXT.search(path):
            n = body.get("limit", 1) if isinstance(body, dict) else 1
            taken, self.jobs = self.jobs[:n], self.jobs[n:]
            if "limit" in (body or {}):
                return httpx.Response(200, json={"claims": [self._grant(j) for j in taken]})
            return httpx.Response(200, json=self._grant(taken[0])) if taken \
                else httpx.Response(204)
        if AGENT_HEARTBEAT.search(path):
            return httpx.Response(200, json={"server_time": stamp(), "results": [
                {"job_id": c["job_id"], "renewed": True,
                 "claim_expires_at": stamp(self.lease_seconds)} for c in body["claims"]]})
        if m := HEARTBEAT.search(path):
            return httpx.Response(200, json={"job_id": m[1], "server_time": stamp(),
                                             "claim_expires_at": stamp(self.lease_seconds)})
        if REPORTS.search(path):
            return httpx.Response(200, json={"results": [
                {"job_id": r["job_id"], "accepted": True} for r in body["reports"]]})
        if m := STATUS.search(path):
            return httpx.Response(200, json={"id": m[1], "status": body["status"]})
        if m := RELEASE.search(path):
            return httpx.Response(200, json={"id": m[1], "status": "queued"})
        if LOG.search(path):
            return httpx.Response(202, json={"attempt": 1, "length": self._log_end(path, body)})
        if m := ARTIFACT.search(path):
            return httpx.Response(201, json={"name": m[2], "size": len(body or b""),
                                             "attempt": 1})
        return httpx.Response(404, json={"code": "not_found", "detail": path})

    def _log_end(self, path, body):
        """A log's length after an append (the length of all bytes sent to `path`)."""
        return sum(len(b or b"") for m, p, b in self.seen if p == path and m == "PATCH")

    def requests(self, pattern, method=None):
        with self.lock:
            return [(m, p, b) for m, p, b in self.seen
                    if pattern.search(p) and (method is None or m == method)]


def answer_once(pattern, status, body, method=None, headers=None):
    used = []

    def rule(m, path, b):
        if not used and pattern.search(path) and (method is None or m == method):
            used.append(1)
            return (status, body, headers or {})
        return None

    return rule


def always(pattern, status, body, method=None):
    return lambda m, path, b: (status, body) if pattern.search(path) and \
        (method is None or m == method) else None


class Running:
    def __init__(self, agent, thread, client):
        self.agent, self.thread, self.client = agent, thread, client
        self.exit_code = None

    def stop(self, timeout=30):
        self.agent.request_stop()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the agent did not stop"
        self.client.close()
        return self.agent.exit_code


@pytest.fixture
def start(caplog):
    caplog.set_level(logging.DEBUG, logger="jobqueue.agent")
    started = []

    def start(server, holder="", **options):
        client = api.AgentClient("http://jq.test", "ws", "ag", "jqa_0123456789ab_s",
                                 transport=httpx.MockTransport(server), holder=holder)
        opts = {"idle_min": 0.02, "idle_max": 0.05, "kill_grace": 0.5, "release_timeout": 3}
        agent = Agent(client, AgentOptions(**{**opts, **options}))
        thread = threading.Thread(target=agent.run, daemon=True)
        thread.start()
        run = Running(agent, thread, client)
        started.append(run)
        return run

    yield start
    for run in started:
        if run.thread.is_alive():
            run.agent.request_stop()
            run.agent.request_stop()
            run.thread.join(30)


def logged(caplog, text, timeout=30):
    return wait_for(lambda: text in caplog.text, timeout, f"the agent to log {text!r}",
                    interval=0.02, on_fail=lambda: caplog.text[-3000:])


# --- reports -------------------------------------------------------------------------------


def test_a_refused_report_publishes_nothing_and_is_not_retried(start, caplog):
    server = Api(["true"])
    server.rules.append(always(STATUS, 409, {"code": "job_cancelled", "detail": "x"}))
    run = start(server)
    logged(caplog, "event=report_refused job=job1 attempt=1 code=job_cancelled")
    assert run.stop() == 0
    assert len(server.requests(STATUS)) == 1


@pytest.mark.parametrize("concurrency", [1, 2])  # the client's report, the reporter's
def test_a_transient_failure_is_reported_with_retry_on_either_report_path(start, caplog,
                                                                           concurrency):
    """Exit status 75 (EX_TEMPFAIL) asks a retry, whether the report goes alone through the
    client (one job at a time) or through the reporter thread (several: a batch of one is
    sent as a single report)."""
    server = Api(["sh", "-c", "exit 75"], ["true"])
    run = start(server, concurrency=concurrency)
    wait_for(lambda: caplog.text.count("event=reported ") == 2, 30, "two reports")
    assert run.stop() == 0
    bodies = {b["job_id"]: b for _, _, body in server.requests(REPORTS)
              for b in body["reports"]}
    bodies.update({p.rsplit("/", 2)[-2]: b for _, p, b in server.requests(STATUS)})
    assert bodies["job1"]["status"] == "failure" and bodies["job1"].get("retry") is True
    assert bodies["job2"]["status"] == "successful" and "retry" not in bodies["job2"]


def test_a_result_the_server_refuses_is_reported_as_failure_without_it(start, caplog):
    """413 (or any 4xx) for a report with a result: the job is reported failed, with why."""
    script = 'echo \'{"big": "result"}\' > "$JOB_RESULT_FILE"'
    server = Api(["sh", "-c", script])
    server.rules.append(answer_once(STATUS, 413, {"code": "payload_too_large", "detail": "big"}))
    run = start(server)
    logged(caplog, "event=reported job=job1 attempt=1 status=failure has_result=False")
    assert run.stop() == 0
    first, second = [b for _, _, b in server.requests(STATUS)]
    assert first["status"] == "successful" and first["result"] == {"big": "result"}
    assert second["status"] == "failure" and "result" not in second
    assert second["message"] == "the report was refused (payload_too_large): big"
    assert "event=report_invalid job=job1 attempt=1 code=payload_too_large fallback=failure" \
        in caplog.text


def test_a_failure_report_the_server_refuses_is_sent_once_more_then_given_up(start, caplog):
    server = Api(["false"])
    server.rules.append(always(STATUS, 400, {"code": "validation_error", "detail": "x"}))
    run = start(server)
    logged(caplog, "event=report_invalid job=job1 attempt=1 code=validation_error "
                   "fallback=failure")
    logged(caplog, "event=report_invalid job=job1 attempt=1 code=validation_error\n")
    assert run.stop() == 0
    first, second = [b for _, _, b in server.requests(STATUS)]
    assert second == {"claim_id": "claim-job1", "status": "failure",
                      "message": "the report was refused (validation_error): x"}


@pytest.mark.parametrize("exit_status", [0, 1, 75])
def test_binary_output_is_reported_without_a_nul(start, caplog, exit_status):
    # The service refuses a NUL in any string: the output's NULs become U+FFFD, and the job's
    # report (its result too) is taken.
    server = Api(["sh", "-c", 'printf "a\\000b\\n"; echo \'{"ok": 1}\' > "$JOB_RESULT_FILE"; '
                  f"exit {exit_status}"])
    server.rules.append(lambda m, path, b: (400, {"code": "validation_error", "detail": "nul"})
                        if STATUS.search(path) and "\\u0000" in json.dumps(b) else None)
    run = start(server)
    logged(caplog, "event=reported job=job1 attempt=1")
    assert run.stop() == 0
    (body,) = [b for _, _, b in server.requests(STATUS)]
    assert "a\ufffdb" in body["message"] and "\x00" not in body["message"]
    assert body["result"] == {"ok": 1}
    assert body["status"] == ("successful" if exit_status == 0 else "failure")
    assert body.get("retry", False) is (exit_status == 75)


@pytest.mark.parametrize(("status", "code"), [(404, "not_found"), (401, "not_authenticated")])
def test_a_report_for_a_job_or_token_that_is_gone_is_abandoned_at_once(start, caplog, status,
                                                                       code):
    server = Api(["true"])
    server.rules.append(always(STATUS, status, {"code": code, "detail": "x"}))
    run = start(server)
    logged(caplog, f"event=report_abandoned job=job1 attempt=1 code={code} status={status}")
    assert run.stop() == 0
    assert len(server.requests(STATUS)) == 1


def test_a_report_is_retried_only_while_the_lease_allows(start, caplog, monkeypatch):
    monkeypatch.setattr(runner, "TERMINAL_REPORT_CAP_SECONDS", 0.5)
    server = Api(["true"])
    server.rules.append(always(STATUS, 503, {"code": "unavailable", "detail": "x"}))
    run = start(server)
    logged(caplog, "event=report_abandoned job=job1 attempt=1 code=unavailable status=503")
    assert run.stop() == 0
    assert len(server.requests(STATUS)) >= 2  # retried, then given up at the cap
    assert "event=report_retry job=job1 attempt=1 code=unavailable status=503" in caplog.text


# --- the batch reporter ------------------------------------------------------------------


def hold_first_report(server, go):
    """Hold the first single report on the wire until the returned event is set, and create
    the file `go` once it is held: jobs that wait for that file end only then, so their
    reports come while the first is on the wire (and wait in the agent's reporter, or, too
    big for a batch, go alone)."""
    gate, held = threading.Event(), []

    def hold(method, path, body):
        if STATUS.search(path) and not held:
            held.append(body["claim_id"])
            go.touch()
            gate.wait(30)

    server.holds.append(hold)
    return gate


def after(go, then=":"):
    """A job command that waits for the file `go`, then runs `then`."""
    return ["sh", "-c", f'while [ ! -e "{go}" ]; do sleep 0.01; done; {then}']


def batch_after_a_held_report(start, tmp_path, reports_rule):
    """Three jobs; the first one's report is held until the other two, which end only once
    it is held, wait in the reporter; then those two go in one batch report, which
    `reports_rule` answers."""
    go = tmp_path / "go"
    server = Api(["true"], after(go), after(go))
    server.rules.append(reports_rule)
    gate = hold_first_report(server, go)
    run = start(server, concurrency=3)
    wait_for(lambda: len(run.agent.reporter._queue) == 2, 30, "two reports to wait")
    gate.set()
    return server, run


def test_a_batch_report_refused_as_a_whole_falls_back_to_single_reports(start, caplog,
                                                                        tmp_path):
    server, run = batch_after_a_held_report(
        start, tmp_path, always(REPORTS, 400, {"code": "validation_error", "detail": "x"}))
    wait_for(lambda: caplog.text.count("event=reported ") == 3, 30, "three reports")
    assert run.stop() == 0
    assert "event=batch_report_refused code=validation_error reports=2 fallback=single" \
        in caplog.text
    assert len(server.requests(STATUS)) == 3  # one held, two after the refused batch


def test_a_failing_batch_report_hands_each_job_the_error_and_each_retries(start, caplog,
                                                                          tmp_path):
    _, run = batch_after_a_held_report(
        start, tmp_path, answer_once(REPORTS, 503, {"code": "unavailable", "detail": "x"}))
    wait_for(lambda: caplog.text.count("event=reported ") == 3, 30, "three reports")
    assert run.stop() == 0
    # The two in the failed batch were told, and each sent its report again.
    assert caplog.text.count("event=report_retry") == 2
    assert caplog.text.count("code=unavailable status=503") == 2


def test_a_bug_in_the_batch_report_does_not_take_the_agent_down(start, caplog, tmp_path):
    server, run = batch_after_a_held_report(
        start, tmp_path, lambda m, p, b: RuntimeError("bug") if REPORTS.search(p) else None)
    logged(caplog, "event=report_batch_error")
    wait_for(lambda: caplog.text.count("event=job_thread_error") == 2, 30, "the job threads")
    server.add(["true"])  # the agent goes on with the next job
    logged(caplog, "event=child_exited job=job4")
    assert run.stop() == 0


def test_a_large_result_skips_the_batch(start, caplog, tmp_path):
    """While the reporter is busy, a report too big for a batch goes out alone at once."""
    big = "x" * (reports.BATCH_REPORT_ITEM_BYTES + 1)
    go = tmp_path / "go"
    server = Api(["true"], after(go, f'printf \'{{"blob": "{big}"}}\' > "$JOB_RESULT_FILE"'))
    gate = hold_first_report(server, go)
    run = start(server, concurrency=2)
    wait_for(lambda: len(server.requests(STATUS)) == 2, 30, "the big report, alone")
    gate.set()
    wait_for(lambda: caplog.text.count("event=reported ") == 2, 30, "two reports")
    assert run.stop() == 0
    held, alone = [b for _, _, b in server.requests(STATUS)]
    assert held["claim_id"] == "claim-job1" and alone["result"] == {"blob": big}
    assert server.requests(REPORTS) == []


# --- heartbeats ----------------------------------------------------------------------------


def test_batch_heartbeat_errors_are_retried_and_refusals_stop_the_job(start, caplog):
    server = Api(["sleep", "30"], ["sleep", "30"], lease_seconds=1)
    state = {"n": 0}

    def beats(m, path, body):
        if not AGENT_HEARTBEAT.search(path):
            return None
        state["n"] += 1
        if state["n"] == 1:
            return (503, {"code": "unavailable", "detail": "x"})
        if state["n"] == 2:  # an answer without one of the jobs: asked again soon
            return (200, {"server_time": stamp(), "results": [
                {"job_id": "job1", "renewed": True, "claim_expires_at": stamp(1)}]})
        return (200, {"server_time": stamp(), "results": [
            {"job_id": c["job_id"], "renewed": False, "code": "claim_superseded"}
            for c in body["claims"]]})

    server.rules.append(beats)
    run = start(server, concurrency=2)
    wait_for(lambda: caplog.text.count("event=abandoned") == 2, 30, "both jobs abandoned",
             on_fail=lambda: caplog.text[-3000:])
    assert run.stop() == 0
    assert re.search(r"event=heartbeat_retry job=job\d attempt=1 code=unavailable status=503",
                     caplog.text)
    # Both refused, job2 too: a renewal missing from an answer is asked for again.
    assert caplog.text.count("code=claim_superseded via=heartbeat") == 2
    assert server.requests(STATUS) == [] and server.requests(REPORTS) == []


@pytest.mark.parametrize("answer", [
    (503, {"code": "unavailable", "detail": "x"}),
    (401, {"code": "not_authenticated", "detail": "x"}),
    httpx.ConnectError("cut off"),
])
def test_a_lease_whose_heartbeats_all_fail_until_it_runs_out_stops_the_job(start, caplog,
                                                                           answer):
    # docs/api.md, "Choosing the heartbeat interval", 3: past the local deadline without a
    # renewal the job is no longer ours (the reaper may hand it to another agent): the child
    # is stopped and nothing is published, whatever the heartbeats' error.
    server = Api(["sleep", "30"], lease_seconds=1)
    server.rules.append(
        (lambda m, path, b: answer if HEARTBEAT.search(path) else None)
        if isinstance(answer, Exception) else always(HEARTBEAT, *answer))
    run = start(server)
    logged(caplog, "event=lease_lost job=job1 attempt=1 code=lease_expired via=local_deadline")
    logged(caplog, "event=abandoned job=job1 attempt=1 code=lease_expired child_stopped=True")
    assert run.stop() == 0
    assert server.requests(STATUS) == [] and server.requests(REPORTS) == []
    assert "event=heartbeat_retry job=job1" in caplog.text


def test_no_heartbeat_crosses_its_claims_report_on_the_wire(start, caplog, tmp_path):
    # The report is held on the wire for longer than a heartbeat interval: the heartbeat
    # falls due meanwhile and waits for the report's answer instead of being sent (it would
    # be refused as stale once the report is taken).
    server = Api(["true"], lease_seconds=1)
    gate = hold_first_report(server, tmp_path / "go")
    run = start(server)
    wait_for(lambda: (tmp_path / "go").exists(), 30, "the report on the wire")
    beats = len(server.requests(HEARTBEAT))
    time.sleep(1.0)  # three heartbeat intervals
    assert len(server.requests(HEARTBEAT)) == beats
    gate.set()
    logged(caplog, "event=reported job=job1 attempt=1 status=successful")
    assert run.stop() == 0
    assert "event=lease_lost" not in caplog.text


def test_a_lease_a_batch_heartbeat_always_leaves_out_is_lost_at_its_deadline(start, caplog):
    server = Api(["sleep", "30"], ["sleep", "30"], lease_seconds=1)
    server.rules.append(lambda m, path, b: (200, {"server_time": stamp(), "results": []})
                        if AGENT_HEARTBEAT.search(path) else None)
    run = start(server, concurrency=2)
    wait_for(lambda: caplog.text.count("event=abandoned") == 2, 30, "both jobs abandoned",
             on_fail=lambda: caplog.text[-3000:])
    assert run.stop() == 0
    assert caplog.text.count("code=lease_expired via=local_deadline last_error=not_in_answer") == 2
    assert server.requests(STATUS) == [] and server.requests(REPORTS) == []


@pytest.mark.parametrize("concurrency", [1, 2])  # claim-next, batch claim
def test_a_claim_held_for_a_while_counts_its_lease_from_its_answer(start, caplog,
                                                                  concurrency):
    # A long-poll the server held 3.5 s, a lease of 3 s: counted from the send, the agent
    # would think its lease over before its first heartbeat, and one 503 there would
    # abandon a job whose lease is good. Counted from the answer (less a margin), it retries
    # and the job ends as it should.
    server = Api(["sleep", "1.5"], lease_seconds=3)
    held = []

    def hold_the_claim(m, path, body):
        if (CLAIM_NEXT.search(path) or path.endswith("/jobs/claim")) and not held:
            held.append(1)
            time.sleep(3.5)

    server.holds.append(hold_the_claim)
    beat = AGENT_HEARTBEAT if concurrency > 1 else HEARTBEAT
    server.rules.append(answer_once(beat, 503, {"code": "unavailable", "detail": "x"}))
    run = start(server, concurrency=concurrency, wait_seconds=5)
    logged(caplog, "event=reported job=job1 attempt=1 status=successful")
    assert run.stop() == 0
    assert "event=heartbeat_retry job=job1" in caplog.text
    assert "event=lease_lost" not in caplog.text
    assert runner.claim_started(10.0, 10.2) == 10.0  # a prompt answer: from the send
    assert runner.claim_started(10.0, 15.0) == 15.0 - runner.CLAIM_ANSWER_MARGIN


def test_a_heartbeat_answered_404_stops_the_job(start, caplog):
    server = Api(["sleep", "30"], lease_seconds=1)
    server.rules.append(always(HEARTBEAT, 404, {"code": "not_found", "detail": "x"}))
    run = start(server)
    logged(caplog, "event=lease_lost job=job1 attempt=1 code=not_found via=heartbeat")
    logged(caplog, "event=abandoned job=job1")
    assert run.stop() == 0
    assert server.requests(STATUS) == []


# --- claiming --------------------------------------------------------------------------------


def test_claim_errors_are_retried_honouring_retry_after(start, caplog):
    server = Api()
    server.rules.append(answer_once(CLAIM_NEXT, 429, {"code": "throttled", "detail": "x"},
                                    headers={"Retry-After": "0"}))
    server.rules.append(answer_once(CLAIM_NEXT, 503, {"code": "unavailable", "detail": "x"}))
    run = start(server)
    logged(caplog, "event=claim_retry code=throttled status=429 retry_in=0.000")
    wait_for(lambda: len(server.requests(CLAIM_NEXT)) >= 3, 30, "claims to go on")
    assert run.stop() == 0
    # A 5xx may have lost a grant: the client sends the claim again with the same
    # Idempotency-Key (tests/unit/agent/test_client.py) before the agent sees an error.
    assert "code=unavailable" not in caplog.text


def test_batch_claims_shrink_to_one_then_fall_back_to_single_claims(start, caplog):
    server = Api(["true"])
    server.rules.append(lambda m, p, b: (400, {"code": "validation_error", "detail": "x",
                                               "fields": {"limit": ["too many"]}})
                        if CLAIM_NEXT.search(p) and "limit" in (b or {}) else None)
    run = start(server, concurrency=2)
    logged(caplog, "event=reported job=job1")
    assert run.stop() == 0
    bodies = [b for _, _, b in server.requests(CLAIM_NEXT)]
    assert bodies[:3] == [{"limit": 2}, {"limit": 1}, {}]
    assert "event=batch_claim_limit_refused limit=1" in caplog.text


def test_a_batch_claim_refused_for_another_reason_stops_the_agent_with_status_1(start, caplog):
    server = Api(["true"])
    server.rules.append(always(CLAIM_NEXT, 400, {"code": "validation_error", "detail": "no",
                                                 "fields": {"wait_seconds": ["bad"]}}))
    run = start(server, concurrency=2)
    run.thread.join(30)
    assert run.agent.exit_code == 1
    assert "event=claim_refused code=validation_error status=400" in caplog.text


def test_jobs_claimed_while_stopping_are_released_at_once(start, caplog):
    server = Api(["true"], ["true"])
    holder, known = {}, threading.Event()

    def stop_then_answer(m, path, body):
        if CLAIM_NEXT.search(path):
            known.wait(30)
            holder["agent"].request_stop()  # the stop comes while the claim is on the wire

    server.holds.append(stop_then_answer)
    holder["agent"] = start(server, concurrency=2).agent
    known.set()
    wait_for(lambda: caplog.text.count("event=released ") == 2, 30, "both jobs released")
    assert [b for _, _, b in server.requests(RELEASE)] == [
        {"claim_id": "claim-job1", "reason": "agent stopping"},
        {"claim_id": "claim-job2", "reason": "agent stopping"},
    ]
    assert server.requests(STATUS) == []


# --- release at the end of a drain ------------------------------------------------------------


@pytest.mark.parametrize(("answer", "rule", "requests", "logged_line"), [
    ((503, {"code": "unavailable", "detail": "x"}), answer_once, 2,
     'event=released job=job1 attempt=1 reason="agent shutting down"'),
    ((409, {"code": "claim_superseded", "detail": "x"}), always, 1,
     "event=release_refused job=job1 attempt=1 code=claim_superseded"),
    ((400, {"code": "validation_error", "detail": "x"}), always, 1,
     "event=release_failed job=job1 attempt=1 code=validation_error"),
], ids=["transient-retried", "refused-left-alone", "invalid-given-up"])
def test_the_release_at_the_end_of_a_drain(start, caplog, answer, rule, requests, logged_line):
    server = Api(["sleep", "30"])
    server.rules.append(rule(RELEASE, *answer))
    run = start(server, drain_timeout=0)
    logged(caplog, "event=started_child job=job1")
    assert run.stop() == 0
    assert len(server.requests(RELEASE)) == requests
    assert logged_line in caplog.text


# --- the agent object ---------------------------------------------------------------------


def test_concurrency_below_one_is_refused_and_active_counts_running_jobs(start, caplog):
    with pytest.raises(ValueError, match="at least 1"):
        Agent(api.AgentClient("http://jq.test", "w", "a", "t"), AgentOptions(concurrency=0))
    run = start(Api(["sleep", "30"], ["sleep", "30"]), concurrency=3, drain_timeout=0)
    wait_for(lambda: run.agent.active == 2, 30, "two jobs to run")
    assert run.stop() == 0
    assert run.agent.active == 0


# --- handover: holder, reconciliation, checkpoints ----------------------------------------

CLAIM_STATE = re.compile(r"/jobs/([^/]+)/claims/([^/]+)$")


def test_claims_name_the_holder(start, caplog):
    server = Api(["true"])
    run = start(server, holder="build-7:4242")
    logged(caplog, "event=reported job=job1")
    assert run.stop() == 0
    assert server.requests(CLAIM_NEXT)[0][2] == {"holder": "build-7:4242"}


@pytest.mark.parametrize(("state", "expect", "puts"), [
    ({"current": False, "code": "job_finished", "final_status": "successful"},
     "event=reported job=job1 attempt=1 status=successful reconciled=True", 1),
    ({"current": False, "code": "job_cancelled"},
     "event=report_refused job=job1 attempt=1 code=job_cancelled reconciled=True", 1),
    ({"current": True, "lease_state": "active"},
     "event=reported job=job1 attempt=1 status=successful has_result=False", 2),
])
def test_a_lost_report_answer_is_reconciled_read_only(start, caplog, state, expect, puts):
    server = Api(["true"])
    lost = []
    server.rules.append(lambda m, p, b: (lost.append(1) or httpx.ReadTimeout("lost"))
                        if STATUS.search(p) and not lost else None)
    server.rules.append(lambda m, p, b: (200, {**state, "server_time": stamp()})
                        if CLAIM_STATE.search(p) else None)
    run = start(server)
    logged(caplog, expect)
    assert run.stop() == 0
    assert len(server.requests(STATUS)) == puts
    checks = server.requests(CLAIM_STATE, "GET")
    assert [p for _, p, _ in checks] == ["/v1/workspaces/ws/jobs/job1/claims/claim-job1"]


def test_the_child_reads_the_previous_checkpoint_and_saves_a_new_one(start, caplog):
    script = ('cat "$JOB_CHECKPOINT_FILE" > "$JOB_RESULT_FILE"; '
              'echo \'{"step": 2}\' > "$JOB_CHECKPOINT_OUT"; sleep 1.5')
    server = Api(["sh", "-c", script], lease_seconds=2)
    grant = server._grant

    def with_checkpoint(job):
        g = grant(job)
        g["claim"]["checkpoint"] = {"step": 1}
        return g

    server._grant = with_checkpoint
    run = start(server)
    logged(caplog, "event=checkpoint_saved job=job1 attempt=1")
    logged(caplog, "event=reported job=job1")
    assert run.stop() == 0
    assert "event=resuming job=job1 attempt=1" in caplog.text
    beats = [b for _, _, b in server.requests(HEARTBEAT)]
    assert {"claim_id": "claim-job1", "checkpoint": {"step": 2}} in beats
    assert sum("checkpoint" in b for b in beats) == 1  # sent once, not with every beat
    (report,) = [b for _, _, b in server.requests(STATUS)]
    assert report["result"] == {"step": 1}


def test_a_checkpoint_the_server_refuses_is_dropped_and_the_lease_renewed(start, caplog):
    script = 'echo \'{"big": 1}\' > "$JOB_CHECKPOINT_OUT"; sleep 1.5'
    server = Api(["sh", "-c", script], lease_seconds=2)
    server.rules.append(lambda m, p, b: (400, {"code": "validation_error", "detail": "x",
                                               "fields": {"checkpoint": ["too big"]}})
                        if HEARTBEAT.search(p) and "checkpoint" in (b or {}) else None)
    run = start(server)
    logged(caplog, "event=checkpoint_refused job=job1 attempt=1 code=validation_error")
    logged(caplog, "event=reported job=job1")
    assert run.stop() == 0
    beats = [b for _, _, b in server.requests(HEARTBEAT)]
    assert {"claim_id": "claim-job1"} in beats


def test_what_the_child_leaves_as_a_checkpoint_is_read_safely(tmp_path):
    from jobqueue_client.client import Claim
    from jobqueue_client.workdir import JobDir

    claim = Claim.from_payload(Api()._grant({"id": "j", "command": ["true"]}))
    lease = Lease(claim, time.monotonic())
    assert lease.new_checkpoint() is None  # no child running
    jobdir = JobDir(base=str(tmp_path))
    try:
        lease.watch(jobdir)
        assert lease.new_checkpoint() is None  # nothing written yet
        out = jobdir.file(child.CHECKPOINT_OUT_FILE)
        for bad in (b"{half", b"null"):
            with open(out, "wb") as fh:
                fh.write(bad)
            assert lease.new_checkpoint() is None
        with open(out, "wb") as fh:
            fh.write(b"x" * (child.CHECKPOINT_MAX_BYTES + 1))
        assert lease.new_checkpoint() is None  # oversized
        with open(out, "wb") as fh:
            fh.write(b'{"k": 1}')
        value, raw = lease.new_checkpoint()
        assert value == {"k": 1}
        lease.checkpoint_sent(raw)
        assert lease.new_checkpoint() is None  # unchanged since sent
    finally:
        jobdir.close()


def test_with_batch_heartbeats_a_new_checkpoint_goes_by_the_single_heartbeat(start, caplog):
    script = 'echo \'{"n": 1}\' > "$JOB_CHECKPOINT_OUT"; sleep 1.5'
    server = Api(["sh", "-c", script], ["sleep", "1.5"], lease_seconds=2)
    run = start(server, concurrency=2)
    logged(caplog, "event=checkpoint_saved job=job1 attempt=1")
    wait_for(lambda: server.requests(AGENT_HEARTBEAT), 10, "a batch heartbeat")
    assert run.stop() == 0
    single = [b for _, _, b in server.requests(HEARTBEAT)]
    assert {"claim_id": "claim-job1", "checkpoint": {"n": 1}} in single
    batched = [c["job_id"] for _, _, b in server.requests(AGENT_HEARTBEAT) for c in b["claims"]]
    assert "job2" in batched


def test_a_heartbeat_refused_as_invalid_without_a_checkpoint_is_retried(start, caplog):
    server = Api(["sleep", "1.2"], lease_seconds=2)
    server.rules.append(answer_once(HEARTBEAT, 400, {"code": "validation_error", "detail": "x"}))
    run = start(server)
    logged(caplog, "event=heartbeat_retry job=job1 attempt=1 code=validation_error status=400")
    logged(caplog, "event=reported job=job1")
    assert run.stop() == 0


# --- retryable failures ----------------------------------------------------------------------


def reports_sent(server):
    """Every report the agent sent, single or in a batch."""
    out = [b for _, _, b in server.requests(STATUS)]
    for _, _, body in server.requests(REPORTS):
        out += body["reports"]
    return out


@pytest.mark.parametrize(("command", "retry"), [
    (["sh", "-c", "exit 75"], True),  # EX_TEMPFAIL: the command says "try again"
    (["sh", "-c", "exit 1"], False),
    (["true"], False),
])
def test_exit_status_75_is_reported_as_a_retryable_failure(start, caplog, command, retry):
    server = Api(command)
    run = start(server)
    logged(caplog, "event=reported job=job1")
    assert run.stop() == 0
    (report,) = reports_sent(server)
    assert report.get("retry", False) is retry
    assert report["status"] == ("successful" if command == ["true"] else "failure")


def test_a_timed_out_child_is_reported_as_a_retryable_failure(start, caplog):
    class TimeoutApi(Api):
        def _grant(self, job):
            grant = super()._grant(job)
            grant["job"]["job_agent_config"]["timeout_seconds"] = 0.3
            return grant

    server = TimeoutApi(["sleep", "30"])
    run = start(server)
    logged(caplog, "event=reported job=job1")
    assert run.stop() == 0
    (report,) = reports_sent(server)
    assert report["status"] == "failure" and report["retry"] is True
    assert report["message"].startswith("timed out")


def test_a_heartbeat_answered_deadline_exceeded_kills_the_child_and_publishes_nothing(
        start, caplog):
    """The job's max_runtime_seconds (or expires_at) ended the attempt: as on a lost lease,
    the child is stopped and nothing is reported."""
    server = Api(["sleep", "30"], lease_seconds=1)
    server.rules.append(always(HEARTBEAT, 409, {"code": "deadline_exceeded", "detail": "x"}))
    run = start(server)
    logged(caplog, "code=deadline_exceeded via=heartbeat")
    logged(caplog, "event=abandoned job=job1")
    assert "child_stopped=True" in caplog.text
    assert run.stop() == 0
    assert server.requests(STATUS) == [] and server.requests(REPORTS) == []


# --- the job's log and its artifacts ----------------------------------------------------------


def log_bytes(server, job="job1"):
    """What the agent sent to the job's log, checked to be contiguous chunks from byte 0."""
    data, offset = b"", 0
    for _m, _p, body in server.requests(re.compile(f"/jobs/{job}/log$"), "PATCH"):
        data += body or b""
    for (_m, _p, _b), rng in zip(server.requests(re.compile(f"/jobs/{job}/log$"), "PATCH"),
                                 server.log_ranges, strict=True):
        start, end = (int(x) for x in rng.removeprefix("bytes ").removesuffix("/*").split("-"))
        assert start == offset, (start, offset)
        offset = end + 1
    return data


def test_the_childs_output_streams_to_the_log_while_it_runs_and_at_the_end(start, caplog):
    script = "echo first; sleep 0.6; echo second >&2; sleep 0.6; printf last"
    server = Api(["sh", "-c", script])
    server.log_ranges = []
    original = server.__call__

    def call(request):
        if request.method == "PATCH":
            server.log_ranges.append(request.headers.get("Content-Range"))
        return original(request)

    run = start(call, log_interval=0.2)
    logged(caplog, "event=reported job=job1 attempt=1 status=successful")
    assert run.stop() == 0
    assert log_bytes(server) == b"first\nsecond\nlast"
    patches = server.requests(LOG, "PATCH")
    assert len(patches) >= 3  # live: while the child ran, not only at its end
    assert patches[0][2] == b"first\n"
    # The log went up before the report.
    order = [p for m, p, b in server.seen if LOG.search(p) or STATUS.search(p)]
    assert STATUS.search(order[-1]) and all(LOG.search(p) for p in order[:-1])
    # The report still carries the output's tail as its message.
    assert server.requests(STATUS)[0][2]["message"] == "first\nsecond\nlast"


def test_a_gap_answer_resends_from_the_servers_length(start, caplog):
    server = Api(["sh", "-c", "printf abc; sleep 0.5; printf def"])
    server.rules.append(answer_once(LOG, 416, {"code": "log_range_gap", "detail": "x"},
                                    headers={"Range": "0-0"}))
    run = start(server, log_interval=0.1)
    logged(caplog, "event=reported job=job1 attempt=1 status=successful")
    assert run.stop() == 0
    bodies = [b for _m, _p, b in server.requests(LOG, "PATCH")]
    assert bodies[0] == b"abc" and b"".join(bodies[1:]) == b"abcdef"


@pytest.mark.parametrize("status, code", [(413, "output_too_large"), (409, "job_cancelled")])
def test_a_refused_log_stops_the_sending_but_not_the_job(start, caplog, status, code):
    server = Api(["sh", "-c", "echo one; sleep 0.5; echo two"])
    server.rules.append(always(LOG, status, {"code": code, "detail": "x"}))
    run = start(server, log_interval=0.1)
    logged(caplog, f"event=log_stopped job=job1 attempt=1 code={code}")
    logged(caplog, "event=reported job=job1 attempt=1 status=successful")
    assert run.stop() == 0
    assert len(server.requests(LOG)) == 1


def test_an_unreachable_log_is_retried_and_the_job_goes_on(start, caplog):
    server = Api(["sh", "-c", "echo one"])
    server.rules.append(answer_once(LOG, 503, {"code": "server_error", "detail": "x"}))
    run = start(server, log_interval=0.1)
    logged(caplog, "event=reported job=job1 attempt=1 status=successful")
    assert run.stop() == 0
    bodies = [b for _m, _p, b in server.requests(LOG, "PATCH")]
    assert bodies == [b"one\n", b"one\n"]


def test_output_beyond_the_log_buffer_is_dropped_with_a_marker(monkeypatch, tmp_path):
    sent = []

    class Client:
        def append_log(self, job_id, claim_id, data, start):
            sent.append((start, data))
            return start + len(data)

    monkeypatch.setattr(logstream, "LOG_BUFFER_BYTES", 10)
    stream = logstream.LogStream(Client(), "j", "c", 1, interval=60)
    stream.feed(b"0123456789abcdef")
    stream.close(timeout=5)
    assert sent == [(0, b"\n[jobqueue-agent: 6 bytes of output dropped]\n6789abcdef")]
    stream.feed(b"after")  # nothing is lost once closed: it is sent by the next close
    stream.close(timeout=5)
    assert sent[-1][1] == b"after"


def test_a_gap_without_a_length_and_an_agent_bug_stop_the_log(caplog):
    class Client:
        def __init__(self, error):
            self.error = error

        def append_log(self, job_id, claim_id, data, start):
            raise self.error

    caplog.set_level(logging.DEBUG, logger="jobqueue.agent")
    for error, code in [(api.LogGap(416, "log_range_gap"), "log_range_gap"),
                        (RuntimeError("bug"), "agent_error")]:
        stream = logstream.LogStream(Client(error), "j", "c", 1, interval=60)
        stream.feed(b"x")
        stream.close(timeout=5)
        assert stream.stopped == code
        stream.feed(b"more")  # ignored once stopped
        assert stream.flush_once() is True


def test_a_log_that_cannot_be_sent_in_time_is_given_up(caplog):
    class Client:
        def append_log(self, job_id, claim_id, data, start):
            raise api.ServerError(503, "server_error", "down")

    caplog.set_level(logging.DEBUG, logger="jobqueue.agent")
    stream = logstream.LogStream(Client(), "j", "c", 1, interval=60)
    stream.feed(b"x")
    stream.close(timeout=0.3)
    assert "event=log_unsent job=j attempt=1 length=0" in caplog.text


ARTIFACTS = re.compile(r"/jobs/job1/artifacts/([^/]+)$")


def test_the_childs_artifacts_are_uploaded_before_its_successful_report(start, caplog):
    script = ('printf hello > "$JOB_ARTIFACTS_DIR/a.txt"; '
              'head -c 200000 /dev/zero > "$JOB_ARTIFACTS_DIR/zeros.bin"')
    server = Api(["sh", "-c", script])
    run = start(server)
    logged(caplog, "event=reported job=job1 attempt=1 status=successful")
    assert run.stop() == 0
    puts = server.requests(ARTIFACTS, "PUT")
    assert [(p.rsplit("/", 1)[1], len(b)) for _m, p, b in puts] == [("a.txt", 5),
                                                                  ("zeros.bin", 200000)]
    assert puts[0][2] == b"hello"
    order = [p for m, p, b in server.seen if ARTIFACTS.search(p) or STATUS.search(p)]
    assert STATUS.search(order[-1])
    assert "event=artifact_uploaded job=job1 attempt=1 name=zeros.bin size=200000" in caplog.text


def test_a_failed_job_uploads_nothing(start, caplog):
    server = Api(["sh", "-c", 'printf x > "$JOB_ARTIFACTS_DIR/a.txt"; exit 3'])
    run = start(server)
    logged(caplog, "event=reported job=job1 attempt=1 status=failure")
    assert run.stop() == 0
    assert server.requests(ARTIFACTS) == []


def test_a_lease_lost_mid_upload_publishes_nothing(start, caplog):
    script = 'printf a > "$JOB_ARTIFACTS_DIR/a.txt"; printf b > "$JOB_ARTIFACTS_DIR/b.txt"'
    server = Api(["sh", "-c", script])
    server.rules.append(lambda m, p, b: (409, {"code": "claim_superseded", "detail": "x"})
                        if p.endswith("/artifacts/b.txt") else None)
    run = start(server)
    logged(caplog, "event=upload_refused job=job1 attempt=1 code=claim_superseded "
                   "published=nothing")
    logged(caplog, "event=abandoned")
    assert run.stop() == 0
    assert server.requests(STATUS) == [] and server.requests(REPORTS) == []
    assert len(server.requests(ARTIFACTS, "PUT")) == 2


@pytest.mark.parametrize("script, first", [
    ('ln -s /etc/passwd "$JOB_ARTIFACTS_DIR/link"',
     "artifact link is a symbolic link, not a regular file"),
    ('mkdir "$JOB_ARTIFACTS_DIR/sub"', "artifact sub is a directory, not a regular file"),
    ('touch "$JOB_ARTIFACTS_DIR/bad name"',
     "JOB_ARTIFACTS_DIR: a file name is not 1-200 of A-Z a-z 0-9 . _ -"),
    ('head -c 2000 /dev/zero > "$JOB_ARTIFACTS_DIR/big"', "artifact big is larger than 1000 bytes"),
    ('for i in 1 2 3 4; do touch "$JOB_ARTIFACTS_DIR/f$i"; done',
     "JOB_ARTIFACTS_DIR holds 4 entries; at most 3 are uploaded"),
])
def test_artifacts_the_agent_refuses_fail_the_job(start, caplog, script, first):
    server = Api(["sh", "-c", script])
    run = start(server, artifact_max_bytes=1000, artifact_max_files=3)
    logged(caplog, "event=reported job=job1 attempt=1 status=failure")
    assert run.stop() == 0
    assert server.requests(STATUS)[0][2]["message"].splitlines()[0] == first


def test_an_upload_is_retried_after_a_transient_error_and_refused_for_good_on_a_4xx(start,
                                                                                   caplog):
    server = Api(["sh", "-c", 'printf abc > "$JOB_ARTIFACTS_DIR/a.txt"'],
                 ["sh", "-c", 'printf abc > "$JOB_ARTIFACTS_DIR/b.txt"'])
    server.rules.append(answer_once(ARTIFACTS, 503, {"code": "server_error", "detail": "x"}))
    server.rules.append(lambda m, p, b: (413, {"code": "output_too_large", "detail": "x"})
                        if p.endswith("/artifacts/b.txt") else None)
    run = start(server)
    logged(caplog, "event=upload_retry job=job1 attempt=1 code=server_error")
    logged(caplog, "event=reported job=job2 attempt=1 status=failure")
    assert run.stop() == 0
    puts = server.requests(re.compile(r"/artifacts/"), "PUT")
    assert [p.rsplit("/", 1)[1] for _m, p, _b in puts] == ["a.txt", "a.txt", "b.txt"]
    assert [b for _m, _p, b in puts[:2]] == [b"abc", b"abc"]  # resent whole
    statuses = {p.split("/")[-2]: b["status"] for _m, p, b in server.requests(STATUS)}
    assert statuses == {"job1": "successful", "job2": "failure"}
    assert server.requests(STATUS)[1][2]["message"].startswith(
        "artifact b.txt was not uploaded (output_too_large)")
