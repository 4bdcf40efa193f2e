"""The effect ledger's channel between the reference agent and its child (effects.py), without
a server: the agent's EffectServer answers over the job directory's Unix socket with what its
client says, marks the lease lost when the service refuses the claim, retries a lost answer;
the child's side (ask / begin / run, `jobqueue-effect`) turns the answers into Effects, typed
errors and exit statuses. Against a real server and agent: tests/e2e/test_agent_effects.py."""

import errno
import json
import logging
import subprocess
import sys
import threading
import time

import pytest
from jobqueue_client import client as api
from jobqueue_client import effects
from jobqueue_client.child import run_child
from jobqueue_client.jobspec import JobSpec
from jobqueue_client.workdir import JobDir


class FakeClient:
    """Stands for AgentClient: records its calls; `fail` holds errors to raise first."""

    def __init__(self):
        self.calls = []
        self.fail = []
        self.entries = {}

    def _maybe_fail(self):
        if self.fail:
            raise self.fail.pop(0)

    def begin_effect(self, job_id, claim_id, key):
        self.calls.append(("begin", job_id, claim_id, key))
        self._maybe_fail()
        entry = self.entries.setdefault(key, {"state": "started", "effect_id": f"id-{key}",
                                              "attempt": 2})
        return api.Effect(key, entry)

    def commit_effect(self, job_id, claim_id, key, result):
        self.calls.append(("commit", job_id, claim_id, key, result))
        self._maybe_fail()
        entry = self.entries[key]
        entry.update(state="committed", result=result)
        return api.Effect(key, entry)


class FakeLease:
    job_id, claim_id, attempt = "job-1", "claim-1", 2

    def __init__(self):
        self.deadline = time.monotonic() + 30
        self.lost_code = ""
        self.finished = False

    @property
    def lost(self):
        return bool(self.lost_code)

    def mark_lost(self, code):
        first = not self.lost_code
        self.lost_code = self.lost_code or code
        return first


@pytest.fixture
def served(tmp_path):
    client, lease = FakeClient(), FakeLease()
    server = effects.EffectServer(client, lease)
    jobdir = JobDir(str(tmp_path))
    env = server.open(jobdir)
    yield client, lease, env[effects.ENV]
    server.close()
    jobdir.close()


def test_begin_and_commit_through_the_socket(served):
    client, lease, path = served
    fx = effects.begin("charge-card", path=path)
    assert (fx.state, fx.effect_id, fx.attempt, fx.committed) == ("started", "id-charge-card",
                                                                  2, False)
    assert fx.commit({"charge": "ch_1"}) == {"charge": "ch_1"} and fx.committed
    assert client.calls == [("begin", "job-1", "claim-1", "charge-card"),
                            ("commit", "job-1", "claim-1", "charge-card", {"charge": "ch_1"})]
    # committed: run() hands back the result without calling the function.
    assert effects.run("charge-card", lambda fx: pytest.fail("ran"), path=path) == {
        "charge": "ch_1"}
    assert effects.run("email", lambda fx: f"sent:{fx.state}", path=path) == "sent:started"


def test_a_refused_claim_is_the_childs_lease_lost_and_stops_the_job(served):
    client, lease, path = served
    client.fail = [api.LeaseLost(409, "claim_superseded", "not yours")]
    with pytest.raises(api.LeaseLost) as refused:
        effects.begin("charge-card", path=path)
    assert refused.value.code == "claim_superseded" and refused.value.status == 409
    assert lease.lost_code == "claim_superseded"


def test_a_404_goes_back_to_the_child_and_leaves_the_lease(served):
    """An older server without the effects route answers 404 not_found: not a lost claim
    (the heartbeat decides that); the child gets the 404 (jobqueue-effect: exit 3)."""
    client, lease, path = served
    client.fail = [api.NotFound(404, "not_found", "Not found.")]
    with pytest.raises(api.NotFound):
        effects.begin("charge-card", path=path)
    assert not lease.lost


def test_other_refusals_come_back_typed_and_leave_the_lease(served):
    client, lease, path = served
    effects.begin("charge-card", path=path)
    client.fail = [api.EffectAlreadyCommitted(409, "effect_already_committed", "other")]
    with pytest.raises(api.EffectAlreadyCommitted):
        effects.commit("charge-card", 2, path=path)
    with pytest.raises(api.InvalidRequest):
        effects.ask({"op": "begin", "key": ".."}, path=path)  # checked by the agent too
    with pytest.raises(api.InvalidRequest):
        effects.ask({"op": "delete", "key": "x"}, path=path)
    assert not lease.lost and [c[0] for c in client.calls] == ["begin", "commit"]


def test_a_late_refusal_after_the_job_ended_leaves_the_lease(tmp_path):
    """A request still being answered when the job ends (its report accepted, the ledger
    closed) neither marks the lease lost nor logs lease_lost, and gives up its retries."""
    client, lease = FakeClient(), FakeLease()
    server = effects.EffectServer(client, lease)
    request = b'{"op": "begin", "key": "k"}'
    lease.finished = True
    client.fail = [api.LeaseLost(409, "job_finished", "done")]
    assert server.answer(request)["error"]["code"] == "job_finished"
    assert not lease.lost
    lease.finished = False
    server.close()
    client.fail = [api.LeaseLost(409, "job_finished", "done")]
    assert server.answer(request)["error"]["code"] == "job_finished"
    assert not lease.lost
    client.fail = [api.TransportError("reset")] * 50
    started = time.monotonic()
    assert server.answer(request)["error"]["code"] == "network_error"
    assert time.monotonic() - started < 5 and len(client.calls) == 3  # no retry once closed


def test_closing_gives_an_answer_being_retried_no_more_time(tmp_path):
    client, lease = FakeClient(), FakeLease()
    server = effects.EffectServer(client, lease)
    with JobDir(str(tmp_path)) as jobdir:
        path = server.open(jobdir)[effects.ENV]
        client.fail = [api.TransportError("reset")] * 1000
        asked = threading.Thread(target=lambda: pytest.raises(
            api.TransportError, effects.begin, "k", path=path), daemon=True)
        asked.start()
        while not client.calls:
            time.sleep(0.01)
        server.close()
        asked.join(timeout=10)
        assert not asked.is_alive() and not lease.lost and len(client.calls) < 10


class BlockingClient(FakeClient):
    def __init__(self):
        super().__init__()
        self.go = threading.Event()

    def begin_effect(self, job_id, claim_id, key):
        self.calls.append(("begin", job_id, claim_id, key))
        self.go.wait(30)
        return api.Effect(key, {"state": "started", "effect_id": "e", "attempt": 2})


def test_closing_with_every_slot_busy_is_not_held_up(tmp_path):
    """MAX_CONNECTIONS requests in flight and one more waiting for a slot: close() still
    ends the serving thread (it waits for a slot no longer than the server is open)."""
    client = BlockingClient()
    server = effects.EffectServer(client, FakeLease())
    with JobDir(str(tmp_path)) as jobdir:
        path = server.open(jobdir)[effects.ENV]
        def ask():
            try:
                effects.begin("k", path=path, timeout=30)
            except api.TransportError:
                pass  # the one waiting for a slot is dropped by close()

        askers = [threading.Thread(target=ask, daemon=True)
                  for _ in range(effects.MAX_CONNECTIONS + 1)]
        for asker in askers:
            asker.start()
        deadline = time.monotonic() + 20
        while len(client.calls) < effects.MAX_CONNECTIONS and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(client.calls) == effects.MAX_CONNECTIONS
        time.sleep(0.2)  # the last one is accepted and waits for a slot
        serving = server._thread
        started = time.monotonic()
        server.close()
        assert not serving.is_alive() and time.monotonic() - started < 4.5
        assert server._sock is None
        client.go.set()


class FlakyAccept:
    """Stands for the listening socket: accept() fails first with `errors`."""

    def __init__(self, sock, errors):
        self.sock, self.errors = sock, errors

    def accept(self):
        if self.errors:
            raise self.errors.pop(0)
        return self.sock.accept()

    def fileno(self):
        return self.sock.fileno()

    def close(self):
        self.sock.close()


def test_a_transient_accept_error_is_logged_and_serving_goes_on(tmp_path, caplog):
    client = FakeClient()
    server = effects.EffectServer(client, FakeLease())
    with JobDir(str(tmp_path)) as jobdir, caplog.at_level(logging.WARNING, "jobqueue.agent"):
        path = server.open(jobdir)[effects.ENV]
        server._sock = FlakyAccept(server._sock, [OSError(errno.EMFILE, "Too many open files"),
                                                  OSError(errno.ECONNABORTED, "aborted")])
        try:
            assert effects.begin("k", path=path, timeout=30).state == "started"
            assert server._thread.is_alive()
        finally:
            server.close()
    logged = [r.getMessage() for r in caplog.records if "effect_accept_error" in r.getMessage()]
    assert len(logged) == 2 and "error=EMFILE" in logged[0] and "retry=yes" in logged[0]


def test_a_lost_answer_is_asked_again_by_the_agent(served):
    client, _lease, path = served
    client.fail = [api.TransportError("reset"), api.ServerError(503, "unavailable", "")]
    assert effects.begin("charge-card", path=path).state == "started"
    assert len(client.calls) == 3


def test_a_request_too_large_is_refused_as_invalid_not_unanswered(served):
    """Over REQUEST_MAX_BYTES: the child refuses it before asking (413: exit 2, not 5); a
    child that sends it anyway hears the agent's 413 (read to its end, not reset)."""
    client, _lease, path = served
    big = "x" * (effects.REQUEST_MAX_BYTES + 10)
    with pytest.raises(api.InvalidRequest) as refused:
        effects.commit("k", big, path=path)
    assert refused.value.status == 413 and refused.value.code == "payload_too_large"
    assert client.calls == []
    raw = json.dumps({"op": "commit", "key": "k", "result": big}).encode() + b"\n"
    with effects.socket.socket(effects.socket.AF_UNIX, effects.socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(path)
        sock.sendall(raw)
        sock.shutdown(effects.socket.SHUT_WR)
        answer = json.loads(effects._read_line(sock, 1 << 20))
    assert answer["error"]["status"] == 413 and answer["error"]["code"] == "payload_too_large"
    env = {"PATH": "/usr/bin:/bin", effects.ENV: path}
    too_large = subprocess.run(
        [sys.executable, "-m", "jobqueue_client.effects", "commit", "k", "--result-file", "-"],
        input=json.dumps(big), capture_output=True, text=True, timeout=60, env=env)
    assert too_large.returncode == 2 and "413 payload_too_large" in too_large.stderr
    assert client.calls == []


def test_nan_and_infinity_are_refused_as_invalid_everywhere(served):
    """NaN / Infinity are not JSON: refused by the child (exit 2), by the agent when a child
    sends them anyway (400, not a traceback and no answer), and an agent's failure is
    answered (500 agent_error), never left without an answer (the child would exit 5)."""
    client, lease, path = served
    effects.begin("k", path=path)
    with pytest.raises(api.InvalidRequest):
        effects.commit("k", float("nan"), path=path)
    env = {"PATH": "/usr/bin:/bin", effects.ENV: path}
    for text in ("NaN", "[Infinity]", '{"a": -Infinity}'):
        refused = command("commit", "k", "--result", text, env=env)
        assert refused.returncode == 2 and "not valid JSON" in refused.stderr
    server = effects.EffectServer(client, lease)
    answer = server.answer(b'{"op": "commit", "key": "k", "result": NaN}')
    assert answer["error"]["status"] == 400 and answer["error"]["code"] == "invalid_request"
    assert [c[0] for c in client.calls] == ["begin"]
    client.fail = [RuntimeError("a bug")]
    with pytest.raises(api.ServerError) as failed:
        effects.begin("k", path=path)
    assert failed.value.status == 500 and failed.value.code == "agent_error"
    assert not lease.lost


def test_without_a_socket_there_is_no_ledger(monkeypatch, tmp_path):
    monkeypatch.delenv(effects.ENV, raising=False)
    with pytest.raises(effects.NoLedger):
        effects.begin("charge-card")
    with pytest.raises(api.TransportError):  # named, but nobody listens
        effects.begin("charge-card", path=str(tmp_path / "gone.sock"))


def test_a_socket_path_too_long_for_sun_path_still_works(tmp_path, monkeypatch):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    client, lease = FakeClient(), FakeLease()
    server = effects.EffectServer(client, lease)
    with JobDir(str(deep)) as jobdir:
        path = server.open(jobdir)[effects.ENV]
        try:
            assert len(path) > effects.SUN_PATH_MAX
            # the child never changes its (process-wide) working directory to reach it
            monkeypatch.setattr(effects.os, "chdir", lambda p: pytest.fail("chdir"))
            assert effects.begin("k", path=path).state == "started"
        finally:
            server.close()


def command(*args, env=None):
    return subprocess.run([sys.executable, "-m", "jobqueue_client.effects", *args],
                          capture_output=True, text=True, timeout=60, env=env)


def test_the_command_prints_the_answer_and_says_by_its_status(served):
    client, _lease, path = served
    env = {"PATH": "/usr/bin:/bin", effects.ENV: path}
    begun = command("begin", "charge-card", env=env)
    assert begun.returncode == 0, begun.stderr
    assert json.loads(begun.stdout) == {"state": "started", "effect_id": "id-charge-card",
                                        "attempt": 2}
    assert command("begin", "charge-card", "--print", "state", env=env).stdout == "started\n"
    done = command("commit", "charge-card", "--result", '{"charge": "ch_1"}', env=env)
    assert done.returncode == 0 and json.loads(done.stdout)["result"] == {"charge": "ch_1"}
    assert command("begin", "charge-card", "--print", "result",
                   env=env).stdout == '{"charge":"ch_1"}\n'
    client.fail = [api.LeaseLost(409, "job_cancelled", "cancelled")]
    refused = command("begin", "other", env=env)
    assert refused.returncode == 6 and "409 job_cancelled" in refused.stderr
    assert command("begin", "a/b", env=env).returncode == 2
    assert command("commit", "k", env=env).returncode == 2  # --result is required
    gone = command("begin", "k", env={"PATH": "/usr/bin:/bin"})
    assert gone.returncode == 5 and "JOB_EFFECT_SOCKET" in gone.stderr
    client.fail = [api.InvalidRequest(400, "validation_error", "result too large")]
    assert command("commit", "charge-card", "--result", "1", env=env).returncode == 2


def test_the_agent_serves_the_ledger_to_the_child_it_runs(tmp_path):
    """run_child passes what on_jobdir returns: the child finds JOB_EFFECT_SOCKET."""
    client, lease = FakeClient(), FakeLease()
    server = effects.EffectServer(client, lease)
    script = (f'"{sys.executable}" -m jobqueue_client.effects begin charge-card --print state '
              '> "$JOB_RESULT_FILE.tmp" && '
              f'"{sys.executable}" -m jobqueue_client.effects commit charge-card --result 7 '
              '> /dev/null && printf "\\"%s\\"" "$(cat "$JOB_RESULT_FILE.tmp")" '
              '> "$JOB_RESULT_FILE"')
    try:
        outcome = run_child(JobSpec(["sh", "-c", script], {}, 30), job_id="job-1", attempt=2,
                            context={}, stop=threading.Event(), on_jobdir=server.open)
    finally:
        server.close()
    assert outcome.returncode == 0, outcome.output_tail
    assert outcome.result == "started"
    assert client.entries["charge-card"]["result"] == 7


def test_with_check_peer_only_the_childs_session_is_answered(tmp_path):
    """As the runner opens it: the child (a new session) and what it starts are answered;
    another process of the same user (here the test itself) is refused 403 (exit 4)."""
    client, lease = FakeClient(), FakeLease()
    server = effects.EffectServer(client, lease)
    paths = []

    def on_jobdir(jobdir):
        env = server.open(jobdir, check_peer=True)
        paths.append(env[effects.ENV])
        return env

    script = (f'"{sys.executable}" -m jobqueue_client.effects begin k --print state '
              '> "$JOB_RESULT_FILE.tmp" && sleep 1 && '
              f'"{sys.executable}" -m jobqueue_client.effects commit k --result 7 > /dev/null')
    outside = []

    def on_start(proc):
        server.admit(proc)
        time.sleep(0.3)
        try:
            effects.begin("k", path=paths[0], timeout=20)
        except api.ApiError as exc:
            outside.append(exc)

    try:
        outcome = run_child(JobSpec(["sh", "-c", script], {}, 30), job_id="job-1", attempt=2,
                            context={}, stop=threading.Event(), on_jobdir=on_jobdir,
                            on_start=on_start)
    finally:
        server.close()
    assert outcome.returncode == 0, outcome.output_tail
    assert client.entries["k"]["result"] == 7
    assert len(outside) == 1 and isinstance(outside[0], api.AuthError)
    assert (outside[0].status, outside[0].code) == (403, "forbidden")
    assert [c[0] for c in client.calls] == ["begin", "commit"]


def test_the_childs_path_leads_to_the_command(tmp_path, monkeypatch):
    scripts, other = tmp_path / "venv-bin", tmp_path / "other"
    scripts.mkdir()
    other.mkdir()
    monkeypatch.setattr(effects.sysconfig, "get_path", lambda name: str(scripts))
    assert effects.command_path("/usr/bin:/bin") == "/usr/bin:/bin"  # not installed there
    (scripts / "jobqueue-effect").write_text("#!/bin/sh\n")
    (scripts / "jobqueue-effect").chmod(0o755)
    assert effects.command_path("/usr/bin:/bin") == f"/usr/bin:/bin:{scripts}"  # appended
    # no PATH: the system's default, not only the scripts directory (sh must still be found)
    assert effects.command_path("") == f"{effects.os.defpath}:{scripts}"
    (other / "jobqueue-effect").write_text("#!/bin/sh\n")
    (other / "jobqueue-effect").chmod(0o755)
    assert effects.command_path(f"{other}:/bin") == f"{other}:/bin"  # found: unchanged


def test_a_thread_that_cannot_start_leaves_no_ledger_and_closes_cleanly(tmp_path,
                                                                         monkeypatch):
    """open() whose thread cannot start: no JOB_EFFECT_SOCKET (the job runs without the
    ledger), the socket and pipe are closed, and close() does not fail."""
    server = effects.EffectServer(FakeClient(), FakeLease())

    def refuse(self):
        raise RuntimeError("can't start new thread")

    with JobDir(str(tmp_path)) as jobdir:
        monkeypatch.setattr(effects.threading.Thread, "start", refuse)
        assert server.open(jobdir) == {}
        monkeypatch.undo()
        assert server._sock is None and server._thread is None and server._wake == (-1, -1)
        server.close()


def test_closing_does_not_wait_for_a_timer(tmp_path):
    """The job's end is not held up by the ledger's thread (it waits on the socket and a
    wake-up pipe; a 0.2 s accept poll once added ~150 ms to every job): the thread has
    ended when close() returns (the bound is generous: a loaded machine)."""
    for _ in range(5):
        server = effects.EffectServer(FakeClient(), FakeLease())
        with JobDir(str(tmp_path)) as jobdir:
            server.open(jobdir)
            serving = server._thread
            time.sleep(0.02)
            started = time.perf_counter()
            server.close()
            took = time.perf_counter() - started
            assert not serving.is_alive() and took < 2, took
            assert server._sock is None and server._thread is None
