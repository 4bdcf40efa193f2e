"""The agent against a real server process: the client's typed errors, which paths the agent
uses (single at concurrency 1, batch above, fallback when the batch ones are missing), retries
of lost responses and 5xx, job outcomes, cancellation, and the SIGTERM drain.

Some tests run the agent in this process so that a recording shim can sit between it and the
server: every request still goes over real HTTP to the real server; the shim only records it,
or answers in the server's place (404/405/503) to stand for an older or failing server, or
drops a response after the server processed it (a lost response).
"""

import json
import logging
import os
import re
import signal
import threading

import httpx
import pytest
from jobqueue_client import client as api
from jobqueue_client.runner import Agent, AgentOptions

from jobqueue import lifecycle, states
from jobqueue.models import Job, JobEvent
from tests.utils import timeline_events

from .harness import audit, pid_alive, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

AGENT_HEARTBEAT = re.compile(r"/job-agents/[^/]+/heartbeat$")
JOB_HEARTBEAT = re.compile(r"/jobs/[^/]+/heartbeat$")
CLAIM_NEXT = re.compile(r"/job-agents/[^/]+/jobs/claim$")
STATUS = re.compile(r"/jobs/[^/]+/status$")
REPORTS = re.compile(r"/job-agents/[^/]+/reports$")
CLAIM_STATE = re.compile(r"/jobs/[^/]+/claims/[^/]+$")


class Shim(httpx.BaseTransport):
    """Forwards to the real server over HTTP and records (method, path, json body).
    `rules` may answer instead of the server, hold the request until a condition holds, or
    lose the server's answer."""

    def __init__(self):
        self.inner = httpx.HTTPTransport()
        self.seen: list[tuple[str, str, object]] = []
        self.rules = []
        self.lock = threading.Lock()

    def handle_request(self, request):
        raw = request.read()
        body = json.loads(raw) if raw else None
        with self.lock:
            self.seen.append((request.method, request.url.path, body))
            action = next((a for a in (rule(request.method, request.url.path, body)
                                       for rule in self.rules) if a), None)
        if action and action[0] == "answer":
            return httpx.Response(action[1], json=action[2])
        if action and action[0] == "hold":  # ("hold", condition, at most seconds)
            wait_for(action[1], action[2], "the condition a held request waits for",
                     interval=0.02)
        response = self.inner.handle_request(request)
        if action and action[0] == "lose":
            response.read()
            response.close()
            raise httpx.ReadError("response lost (test shim)")
        return response

    def close(self):
        self.inner.close()

    def paths(self, pattern, method="POST"):
        return [(p, b) for m, p, b in self.seen if m == method and pattern.search(p)]


def once(pattern, action, method=None):
    state = {"used": False}

    def rule(m, path, body):
        if not state["used"] and pattern.search(path) and (method is None or m == method):
            state["used"] = True
            return action
        return None

    return rule


@pytest.fixture
def in_process(stack, monkeypatch):
    """Run an Agent in a thread of this process, talking through a Shim."""
    started = []
    monkeypatch.setenv("E2E_LOG", str(stack.exec_log))
    monkeypatch.setenv("E2E_AGENT", "inproc")

    def start(job_agent, token, shim, **options):
        client = api.AgentClient(stack.url, str(job_agent.workspace_id), str(job_agent.id),
                                 token, transport=shim)
        agent = Agent(client, AgentOptions(idle_min=0.05, idle_max=0.3, kill_grace=1,
                                           **options))
        thread = threading.Thread(target=agent.run, daemon=True)
        thread.start()
        started.append((agent, thread, client))
        return agent

    yield start
    for agent, thread, client in started:
        agent.request_stop()
        agent.request_stop()
        thread.join(timeout=30)
        client.close()


def hold_until_all_ended(stack, n):
    """A rule action: hold the request until the commands of n jobs have ended (so that
    their reports are waiting in the agent's reporter meanwhile)."""
    return ("hold", lambda: sum(r["what"] == "end" for r in stack.executions()) >= n, 30)


def all_done(ids, stack, timeout=60):
    return wait_for(
        lambda: Job.objects.filter(id__in=ids, status__in=states.TERMINAL).count() == len(ids),
        timeout, "every job to end", on_fail=stack.logs)


# --- the client ----------------------------------------------------------------------------


def test_client_speaks_the_agent_api_with_typed_errors(stack, make_agent, make_jobs):
    agent, token = make_agent(lease_seconds=30)
    [job] = make_jobs(agent, 1, ["true"], dispatch_context={"secret": "s"})
    ws, ag = str(agent.workspace_id), str(agent.id)
    with api.AgentClient(stack.url, ws, ag, token) as c:
        items = c.list_jobs()["results"]
        assert [i["id"] for i in items] == [str(job.id)] and "dispatch_context" not in items[0]
        claim = c.claim_next()
        assert claim.job_id == str(job.id) and claim.attempt == 1 and claim.lease_seconds == 30
        assert claim.job["dispatch_context"] == {"secret": "s"}
        assert 29 <= claim.lease_remaining <= 30 and claim.heartbeat_interval_seconds == 10
        assert "secret" not in repr(claim) and token not in repr(c)
        assert c.claim_next() is None  # 204
        with pytest.raises(api.NotClaimable) as exc:
            c.claim(str(job.id))
        assert exc.value.code == "job_not_claimable" and exc.value.status == 409
        renewal = c.heartbeat(claim.job_id, claim.claim_id)
        assert renewal.renewed and renewal.lease_remaining > 29
        [batch] = c.heartbeat_batch([(claim.job_id, claim.claim_id)])
        assert batch.renewed and batch.job_id == claim.job_id
        with pytest.raises(api.LeaseLost) as exc:
            c.heartbeat(claim.job_id, "00000000-0000-0000-0000-000000000000")
        assert exc.value.code == "claim_superseded"
        with pytest.raises(api.InvalidRequest) as exc:
            c.report(claim.job_id, claim.claim_id, "bogus")
        assert exc.value.code == "validation_error" and "status" in exc.value.fields
        released = c.release(claim.job_id, claim.claim_id, reason="test")
        assert released["status"] == "queued"
        with pytest.raises(api.LeaseLost) as exc:
            c.report(claim.job_id, claim.claim_id, "successful")
        assert exc.value.code == "claim_superseded"

        again = c.claim(str(job.id))
        done = c.report(again.job_id, again.claim_id, "successful", result={"ok": 1})
        assert done["status"] == "successful" and "dispatch_context" not in done
        # A retried identical terminal report (after a lost response) is a success.
        assert c.report(again.job_id, again.claim_id, "successful")["status"] == "successful"
        with pytest.raises(api.LeaseLost) as exc:
            c.heartbeat(again.job_id, again.claim_id)
        assert exc.value.code == "job_finished"

    with api.AgentClient(stack.url, ws, ag, "jqa_000000000000_wrong") as c, \
            pytest.raises(api.AuthError) as exc:
        c.claim_next()
    assert exc.value.status == 401 and exc.value.code in ("authentication_failed",
                                                          "not_authenticated")
    with api.AgentClient("http://127.0.0.1:1", ws, ag, token) as c, \
            pytest.raises(api.TransportError) as exc:
        c.claim_next()
    assert exc.value.transient and exc.value.code == "network_error"


# --- which paths the agent uses ------------------------------------------------------------


def test_concurrency_one_uses_only_the_single_paths(stack, make_agent, make_jobs, in_process):
    agent, token = make_agent(lease_seconds=2)
    jobs = make_jobs(agent, 2, stack.command("sleep 1.5"))
    shim = Shim()
    in_process(agent, token, shim, concurrency=1)
    all_done([j.id for j in jobs], stack)
    claims = shim.paths(CLAIM_NEXT)
    assert claims and all("limit" not in (body or {}) for _, body in claims)
    assert len(shim.paths(JOB_HEARTBEAT)) >= 2
    assert shim.paths(AGENT_HEARTBEAT) == []
    assert set(Job.objects.values_list("status", flat=True)) == {states.SUCCESSFUL}


def test_concurrency_above_one_uses_the_batch_paths(stack, make_agent, make_jobs, in_process):
    agent, token = make_agent(lease_seconds=2)
    jobs = make_jobs(agent, 4, stack.command("sleep 1.5"))
    shim = Shim()
    in_process(agent, token, shim, concurrency=3)
    all_done([j.id for j in jobs], stack)
    claims = shim.paths(CLAIM_NEXT)
    assert claims and all(isinstance(b, dict) and 1 <= b.get("limit", 0) <= 3 for _, b in claims)
    assert claims[0][1]["limit"] == 3 and claims[0][1]["holder"].endswith(f":{os.getpid()}")
    beats = shim.paths(AGENT_HEARTBEAT)
    assert beats and all(len(b["claims"]) >= 1 for _, b in beats)
    assert shim.paths(JOB_HEARTBEAT) == []
    assert set(Job.objects.values_list("status", flat=True)) == {states.SUCCESSFUL}


def test_falls_back_to_single_paths_when_the_batch_ones_are_missing(
        stack, make_agent, make_jobs, in_process, caplog):
    agent, token = make_agent(lease_seconds=2)
    jobs = make_jobs(agent, 4, stack.command("sleep 1.5"))
    shim = Shim()
    # An older server: no agent-level heartbeat (404), no batch claim (405 here).
    shim.rules.append(lambda m, p, b: ("answer", 404, {"code": "not_found", "detail": "x"})
                      if AGENT_HEARTBEAT.search(p) else None)
    shim.rules.append(lambda m, p, b: ("answer", 405, {"code": "method_not_allowed",
                                                       "detail": "x"})
                      if CLAIM_NEXT.search(p) and isinstance(b, dict) and "limit" in b else None)
    caplog.set_level(logging.INFO, logger="jobqueue.agent")
    in_process(agent, token, shim, concurrency=3)
    all_done([j.id for j in jobs], stack)
    assert set(Job.objects.values_list("status", flat=True)) == {states.SUCCESSFUL}
    claims = shim.paths(CLAIM_NEXT)
    assert claims[0][1]["limit"] == 3 and claims[0][1]["holder"].endswith(f":{os.getpid()}")
    assert [b for _, b in claims[1:] if b and "limit" in b] == []
    assert len(shim.paths(AGENT_HEARTBEAT)) == 1
    assert len(shim.paths(JOB_HEARTBEAT)) >= 2
    assert "event=batch_claim_unsupported" in caplog.text
    assert "event=batch_heartbeat_unsupported" in caplog.text


def test_reports_that_wait_together_go_in_one_batch_report(stack, make_agent, make_jobs,
                                                          in_process):
    """Six jobs end while the first report is held up on the wire: the others wait in the
    reporter and go together in one POST job-agents/{id}/reports."""
    agent, token = make_agent(lease_seconds=5)
    jobs = make_jobs(agent, 6, stack.command("sleep 0.5"))
    shim = Shim()
    shim.rules.append(once(STATUS, hold_until_all_ended(stack, 6), method="PUT"))
    in_process(agent, token, shim, concurrency=6)
    all_done([j.id for j in jobs], stack)
    batches = shim.paths(REPORTS)
    assert batches, shim.seen
    assert max(len(b["reports"]) for _, b in batches) >= 2
    sent = [r["job_id"] for _, b in batches for r in b["reports"]]
    sent += [p.split("/")[-2] for p, _ in shim.paths(STATUS, method="PUT")]
    assert sorted(sent) == sorted(str(j.id) for j in jobs)  # each job reported once
    assert set(Job.objects.values_list("status", flat=True)) == {states.SUCCESSFUL}
    for job in jobs:
        assert len(timeline_events(job.id, JobEvent.STATUS_REPORTED)) == 1
    assert audit([j.id for j in jobs])["violations"] == []


def test_a_lost_batch_report_response_is_retried(
        stack, make_agent, make_jobs, in_process, caplog):
    agent, token = make_agent(lease_seconds=5)
    jobs = make_jobs(agent, 6, stack.command("sleep 0.5"))
    shim = Shim()
    shim.rules.append(once(STATUS, hold_until_all_ended(stack, 6), method="PUT"))
    shim.rules.append(once(REPORTS, ("lose",)))
    caplog.set_level(logging.INFO, logger="jobqueue.agent")
    in_process(agent, token, shim, concurrency=6)
    all_done([j.id for j in jobs], stack)
    wait_for(lambda: caplog.text.count("event=reported ") == 6, 30, "every report")
    # The batch was applied, its answer lost; each report was reconciled, read-only: it had
    # landed, so none was sent again.
    reconciled = caplog.text.count("reconciled=True")
    assert reconciled >= 1 and len(shim.paths(CLAIM_STATE, method="GET")) == reconciled
    for job in jobs:
        assert len(timeline_events(job.id, JobEvent.STATUS_REPORTED)) == 1
    assert set(Job.objects.values_list("status", flat=True)) == {states.SUCCESSFUL}
    assert audit([j.id for j in jobs])["violations"] == []


def test_falls_back_to_single_reports_when_the_batch_report_is_missing(
        stack, make_agent, make_jobs, in_process, caplog):
    agent, token = make_agent(lease_seconds=5)
    more = make_jobs(agent, 6, stack.command("sleep 0.5"))
    caplog.set_level(logging.INFO, logger="jobqueue.agent")
    older = Shim()
    older.rules.append(once(STATUS, hold_until_all_ended(stack, 6), method="PUT"))
    older.rules.append(lambda m, p, b: ("answer", 404, {"code": "not_found", "detail": "x"})
                       if REPORTS.search(p) else None)
    in_process(agent, token, older, concurrency=6)
    all_done([j.id for j in more], stack)
    assert "event=batch_report_unsupported" in caplog.text
    assert len(older.paths(REPORTS)) == 1
    assert len(older.paths(STATUS, method="PUT")) == 6
    assert audit([j.id for j in more])["violations"] == []


def test_lost_report_response_and_5xx_are_retried(stack, make_agent, make_jobs, in_process,
                                                  caplog):
    agent, token = make_agent(lease_seconds=2)
    [job] = make_jobs(agent, 1, stack.command("sleep 1.5"))
    shim = Shim()
    shim.rules.append(once(JOB_HEARTBEAT, ("answer", 503, {"code": "server_error",
                                                           "detail": "x"})))
    shim.rules.append(once(STATUS, ("lose",), method="PUT"))
    caplog.set_level(logging.INFO, logger="jobqueue.agent")
    in_process(agent, token, shim, concurrency=1)
    all_done([job.id], stack)
    # The first report was applied but its answer lost: the agent asked, read-only, and
    # learnt that it had landed (no second report).
    wait_for(lambda: f"event=reported job={job.id}" in caplog.text, 30, "the reconciliation")
    job.refresh_from_db()
    assert (job.status, job.attempt, job.result["agent"]) == (states.SUCCESSFUL, 1, "inproc")
    assert len(shim.paths(STATUS, method="PUT")) == 1
    assert len(shim.paths(CLAIM_STATE, method="GET")) == 1
    assert len(timeline_events(job.id, JobEvent.STATUS_REPORTED)) == 1
    assert f"event=heartbeat_retry job={job.id} attempt=1 code=server_error status=503" \
        in caplog.text
    assert f"event=reported job={job.id} attempt=1 status=successful reconciled=True" \
        in caplog.text
    assert audit([job.id])["violations"] == []


# --- outcomes, cancellation, drain (the real command) -----------------------------------------


def test_job_outcomes_and_cancellation(stack, make_agent, make_jobs):
    agent, token = make_agent(lease_seconds=2)
    [failing] = make_jobs(agent, 1, ["sh", "-c", "echo step one; echo it broke >&2; exit 3"])
    # A timeout is transient (the agent asks a retry): one attempt makes it the last.
    [slow] = make_jobs(agent, 1, stack.command("sleep 30"), timeout_seconds=1, max_attempts=1)
    [cancel] = make_jobs(agent, 1, stack.command("sleep 30"))
    [bad] = make_jobs(agent, 1, "not a list")
    [garbage] = make_jobs(agent, 1, ["sh", "-c", 'echo "{oops" > "$JOB_RESULT_FILE"'])
    a = stack.start_agent(agent, token, "A", concurrency=5)
    [start] = wait_for(lambda: stack.starts(cancel.id), 30, "the job to be cancelled to start",
                       on_fail=stack.logs)
    lifecycle.cancel_job(cancel.id, actor="operator:test", reason="not needed")
    ids = [failing.id, slow.id, cancel.id, bad.id, garbage.id]
    all_done(ids, stack)
    wait_for(lambda: not pid_alive(start["pid"]), 30, "the cancelled job's child to be stopped")
    wait_for(lambda: f"event=abandoned job={cancel.id}" in a.output(), 30, "the agent to give up")
    jobs = {j.id: j for j in Job.objects.filter(id__in=ids)}

    assert jobs[failing.id].status == states.FAILURE
    assert jobs[failing.id].message.startswith("exit status 3\n")
    assert "step one" in jobs[failing.id].message and "it broke" in jobs[failing.id].message
    assert jobs[slow.id].status == states.FAILURE
    assert jobs[slow.id].message.startswith("timed out")
    assert [r["what"] for r in stack.executions() if r["job"] == str(slow.id)] == ["start"]
    [ended] = JobEvent.objects.filter(job_id=slow.id, kind=JobEvent.STATUS_REPORTED)
    assert (ended.detail["retry"], ended.detail["requeued"]) == (True, False)
    assert jobs[cancel.id].status == states.CANCELLED
    assert not timeline_events(cancel.id, JobEvent.STATUS_REPORTED)
    assert f"event=lease_lost job={cancel.id} attempt=1 code=job_cancelled" in a.output()
    assert jobs[bad.id].status == states.FAILURE
    assert "command must be a non-empty list" in jobs[bad.id].message
    assert jobs[garbage.id].status == states.FAILURE
    assert "not valid JSON" in jobs[garbage.id].message
    assert audit(ids)["violations"] == []
    assert a.stop() == 0


def test_sigterm_lets_the_running_job_finish_and_stops_claiming(stack, make_agent, make_jobs):
    agent, token = make_agent(lease_seconds=2)
    first, second = make_jobs(agent, 2, stack.command("sleep 2"))
    a = stack.start_agent(agent, token, "A", drain_timeout=20)
    [start] = wait_for(lambda: stack.starts(), 30, "a job to start", on_fail=stack.logs)
    a.signal(signal.SIGTERM)
    assert a.popen.wait(timeout=60) == 0
    ran = Job.objects.get(id=start["job"])
    other = Job.objects.get(id=second.id if ran.id == first.id else first.id)
    assert (ran.status, ran.attempt) == (states.SUCCESSFUL, 1)
    assert (other.status, other.attempt) == (states.QUEUED, 0)
    out = a.output()
    assert "event=signal name=SIGTERM action=drain" in out and "event=draining jobs=1" in out
    assert "event=stopped exit_code=0" in out


def test_drain_timeout_stops_and_releases_what_is_left(stack, make_agent, make_jobs):
    agent, token = make_agent(lease_seconds=2)
    [job] = make_jobs(agent, 1, stack.command("sleep 60"))
    a = stack.start_agent(agent, token, "A", drain_timeout=1, kill_grace=1)
    [start] = wait_for(lambda: stack.starts(job.id), 30, "the job to start", on_fail=stack.logs)
    a.signal(signal.SIGTERM)
    assert a.popen.wait(timeout=60) == 0
    assert not pid_alive(start["pid"])
    job.refresh_from_db()
    assert (job.status, job.attempt) == (states.QUEUED, 1)
    (claimed,) = timeline_events(job.id, JobEvent.CLAIMED)
    released = JobEvent.objects.get(job_id=job.id, kind=JobEvent.RELEASED)
    assert released.claim_id == claimed.claim_id
    assert f"event=released job={job.id} attempt=1" in a.output()
    assert list((stack.tmp / "tmp-A").iterdir()) == []


def test_refused_credentials_stop_the_agent_with_status_1(stack, make_agent, caplog):
    agent, token = make_agent()
    caplog.set_level(logging.INFO, logger="jobqueue.agent")
    client = api.AgentClient(stack.url, str(agent.workspace_id), str(agent.id),
                             "jqa_000000000000_revoked-or-wrong")
    try:
        assert Agent(client, AgentOptions(idle_max=0.3)).run() == 1
    finally:
        client.close()
    assert "event=claim_refused code=authentication_failed status=401" in caplog.text \
        or "event=claim_refused code=not_authenticated status=401" in caplog.text
    assert token not in caplog.text


def test_batch_claims_shrink_to_the_servers_limit(stack, make_agent, make_jobs, in_process,
                                                  caplog):
    stack.kill_server()
    stack.server_env = {"JOBQUEUE_MAX_CLAIM_BATCH": "2"}
    stack.start_server()
    agent, token = make_agent(lease_seconds=5)
    jobs = make_jobs(agent, 6, stack.command("sleep 0.5"))
    shim = Shim()
    caplog.set_level(logging.INFO, logger="jobqueue.agent")
    in_process(agent, token, shim, concurrency=5)
    all_done([j.id for j in jobs], stack)
    assert set(Job.objects.values_list("status", flat=True)) == {states.SUCCESSFUL}
    limits = [b["limit"] for _, b in shim.paths(CLAIM_NEXT)]
    assert limits[:2] == [5, 2] and max(limits[1:]) <= 2
    assert "event=batch_claim_limit_refused limit=5 next_limit=2" in caplog.text
