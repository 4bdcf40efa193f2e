"""The effect ledger's channel between the reference agent and its child, without a server:
the agent's EffectServer (effect_server.py) answers over the job directory's Unix socket with
what its client says, marks the lease lost when the service refuses the claim, retries a lost
answer; the child's side (effects.py: ask / begin / run, `jobqueue-effect`) turns the answers
into Effects, typed errors and exit statuses. Against a real server and agent:
tests/e2e/test_agent_effects.py."""

import errno
import io
import json
import logging
import os
import subprocess
import sys
import threading
import time

import pytest
from jobqueue_client import client as api
from jobqueue_client import effect_server, effects
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
    server = effect_server.EffectServer(client, lease)
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
    server = effect_server.EffectServer(client, lease)
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
    server = effect_server.EffectServer(client, lease)
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
    server = effect_server.EffectServer(client, FakeLease())
    with JobDir(str(tmp_path)) as jobdir:
        path = server.open(jobdir)[effects.ENV]
        def ask():
            try:
                effects.begin("k", path=path, timeout=30)
            except api.TransportError:
                pass  # the one waiting for a slot is dropped by close()

        askers = [threading.Thread(target=ask, daemon=True)
                  for _ in range(effect_server.MAX_CONNECTIONS + 1)]
        for asker in askers:
            asker.start()
        deadline = time.monotonic() + 20
        while len(client.calls) < effect_server.MAX_CONNECTIONS and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(client.calls) == effect_server.MAX_CONNECTIONS
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
    server = effect_server.EffectServer(client, FakeLease())
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
        answer = json.loads(effect_server.read_line(sock, 1 << 20))
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
    server = effect_server.EffectServer(client, lease)
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
    server = effect_server.EffectServer(client, lease)
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
    server = effect_server.EffectServer(client, lease)
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
    server = effect_server.EffectServer(client, lease)
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
    monkeypatch.setattr(effect_server.sysconfig, "get_path", lambda name: str(scripts))
    assert effect_server.command_path("/usr/bin:/bin") == "/usr/bin:/bin"  # not installed there
    (scripts / "jobqueue-effect").write_text("#!/bin/sh\n")
    (scripts / "jobqueue-effect").chmod(0o755)
    assert effect_server.command_path("/usr/bin:/bin") == f"/usr/bin:/bin:{scripts}"  # appended
    # no PATH: the system's default, not only the scripts directory (sh must still be found)
    assert effect_server.command_path("") == f"{effect_server.os.defpath}:{scripts}"
    (other / "jobqueue-effect").write_text("#!/bin/sh\n")
    (other / "jobqueue-effect").chmod(0o755)
    assert effect_server.command_path(f"{other}:/bin") == f"{other}:/bin"  # found: unchanged


def test_a_thread_that_cannot_start_leaves_no_ledger_and_closes_cleanly(tmp_path,
                                                                         monkeypatch):
    """open() whose thread cannot start: no JOB_EFFECT_SOCKET (the job runs without the
    ledger), the socket and pipe are closed, and close() does not fail."""
    server = effect_server.EffectServer(FakeClient(), FakeLease())

    def refuse(self):
        raise RuntimeError("can't start new thread")

    with JobDir(str(tmp_path)) as jobdir:
        monkeypatch.setattr(effect_server.threading.Thread, "start", refuse)
        assert server.open(jobdir) == {}
        monkeypatch.undo()
        assert server._sock is None and server._thread is None and server._wake == (-1, -1)
        server.close()


def test_closing_does_not_wait_for_a_timer(tmp_path):
    """The job's end is not held up by the ledger's thread (it waits on the socket and a
    wake-up pipe; a 0.2 s accept poll once added ~150 ms to every job): the thread has
    ended when close() returns (the bound is generous: a loaded machine)."""
    for _ in range(5):
        server = effect_server.EffectServer(FakeClient(), FakeLease())
        with JobDir(str(tmp_path)) as jobdir:
            server.open(jobdir)
            serving = server._thread
            time.sleep(0.02)
            started = time.perf_counter()
            server.close()
            took = time.perf_counter() - started
            assert not serving.is_alive() and took < 2, took
            assert server._sock is None and server._thread is None


# --- the error paths of the agent's side -------------------------------------------------------


def raw_ask(path, data: bytes, *, shut=True, timeout=30):
    """Send `data` as a child would (shutting its side when `shut`); the agent's answer."""
    with effects.socket.socket(effects.socket.AF_UNIX, effects.socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        sock.sendall(data)
        if shut:
            sock.shutdown(effects.socket.SHUT_WR)
        return json.loads(effect_server.read_line(sock, 1 << 20))


def wait_for(predicate, seconds=10):
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.01)


def test_a_socket_that_cannot_be_made_leaves_no_ledger(tmp_path, monkeypatch, caplog):
    """The socket's name taken (bind: EADDRINUSE), or no pipe for the thread's wake-up
    (EMFILE): the job runs without JOB_EFFECT_SOCKET, logged, nothing left open."""
    server = effect_server.EffectServer(FakeClient(), FakeLease())
    with JobDir(str(tmp_path)) as jobdir, caplog.at_level(logging.WARNING, "jobqueue.agent"):
        with open(jobdir.file(effect_server.SOCKET_NAME), "w"):
            pass
        assert server.open(jobdir) == {} and server._sock is None
        os.remove(jobdir.file(effect_server.SOCKET_NAME))

        def no_pipe():
            raise OSError(errno.EMFILE, "Too many open files")

        monkeypatch.setattr(effect_server.os, "pipe", no_pipe)
        assert server.open(jobdir) == {}
        monkeypatch.undo()
        assert server._sock is None and server._thread is None and server._wake == (-1, -1)
        server.close()
    logged = [r.getMessage() for r in caplog.records]
    assert [m.split(" error=")[1] for m in logged if "effect_socket_failed" in m] == [
        "OSError", "OSError"]


def test_with_check_peer_a_caller_before_the_child_started_is_refused(tmp_path, monkeypatch):
    """No admit() within READ_TIMEOUT_SECONDS (the child never started): refused, 403."""
    monkeypatch.setattr(effect_server, "READ_TIMEOUT_SECONDS", 0.2)
    client = FakeClient()
    server = effect_server.EffectServer(client, FakeLease())
    with JobDir(str(tmp_path)) as jobdir:
        path = server.open(jobdir, check_peer=True)[effects.ENV]
        try:
            with pytest.raises(api.AuthError) as refused:
                effects.begin("k", path=path, timeout=10)
        finally:
            server.close()
    assert refused.value.status == 403 and "not known" in refused.value.detail
    assert client.calls == []


class Exited:
    """Stands for the child's Popen in admit(): only its pid is read."""

    def __init__(self, pid):
        self.pid = pid


def test_with_check_peer_a_caller_gone_before_it_is_checked_is_refused(tmp_path, caplog):
    """The caller exited (and was reaped) before its session could be read: not answered,
    nor a crash of the handler (its answer meets a closed connection)."""
    client = FakeClient()
    server = effect_server.EffectServer(client, FakeLease())
    with JobDir(str(tmp_path)) as jobdir, caplog.at_level(logging.WARNING, "jobqueue.agent"):
        path = server.open(jobdir, check_peer=True)[effects.ENV]
        try:
            gone = subprocess.run(
                [sys.executable, "-c", "import socket, sys\n"
                 "s = socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\n"
                 "s.sendall(b'{\"op\": \"begin\", \"key\": \"k\"}\\n')", path],
                capture_output=True, text=True, timeout=60)
            assert gone.returncode == 0, gone.stderr
            server.admit(Exited(os.getpid()))  # any session: the caller is gone
            wait_for(lambda: any("effect_peer_refused" in r.getMessage()
                                 for r in caplog.records))
        finally:
            server.close()
    refused = [r.getMessage() for r in caplog.records if "effect_peer_refused" in r.getMessage()]
    assert refused[0].endswith("reason=the_caller_cannot_be_identified")
    assert client.calls == [] and not any("effect_error" in r.getMessage()
                                          for r in caplog.records)


def test_a_serving_thread_that_outlives_close_releases_the_socket_itself(tmp_path,
                                                                         monkeypatch):
    """close() waits SERVE_JOIN_SECONDS for the serving thread; one still running then
    keeps the socket and pipe (closing them under its feet could hand their descriptors to
    another file it then reads) and releases them when it ends. A second close() changes
    nothing."""
    monkeypatch.setattr(effect_server, "SERVE_JOIN_SECONDS", 0.1)
    server = effect_server.EffectServer(FakeClient(), FakeLease())
    go_on = threading.Event()
    server._accept_loop = lambda: go_on.wait(30)  # stands for a loop held up in a handler
    with JobDir(str(tmp_path)) as jobdir:
        server.open(jobdir)
        serving, sock = server._thread, server._sock
        server.close()
        assert serving.is_alive() and server._sock is sock and sock.fileno() >= 0
        server.close()
        assert server._sock is sock and sock.fileno() >= 0
        go_on.set()
        serving.join(timeout=10)
        assert not serving.is_alive()
        assert server._sock is None and sock.fileno() == -1 and server._wake == (-1, -1)


def pending_connection(path):
    """A connection waiting in the socket's backlog (nothing sent)."""
    sock = effects.socket.socket(effects.socket.AF_UNIX, effects.socket.SOCK_STREAM)
    sock.connect(path)
    return sock


def test_accept_errors_spurious_fatal_and_transient(tmp_path, monkeypatch, caplog):
    """accept() after a wake-up with nothing to accept (EAGAIN) is tried again, silently;
    an error that waiting cannot mend (EBADF) ends serving (logged retry=no; the job runs
    on without the ledger); close() during a transient error's back-off ends it too."""
    client = FakeClient()
    with JobDir(str(tmp_path)) as jobdir, caplog.at_level(logging.WARNING, "jobqueue.agent"):
        server = effect_server.EffectServer(client, FakeLease())
        path = server.open(jobdir)[effects.ENV]
        server._sock = FlakyAccept(server._sock, [BlockingIOError()])
        try:
            assert effects.begin("k", path=path, timeout=30).state == "started"
        finally:
            server.close()
        assert not any("effect_accept_error" in r.getMessage() for r in caplog.records)
        os.remove(path)

        server = effect_server.EffectServer(client, FakeLease())
        path = server.open(jobdir)[effects.ENV]
        server._sock = FlakyAccept(server._sock, [OSError(errno.EBADF, "Bad file")])
        serving = server._thread
        with pending_connection(path):
            serving.join(timeout=10)
            assert not serving.is_alive()
        server.close()
        assert server._sock is None
        os.remove(path)

        monkeypatch.setattr(effect_server, "ACCEPT_BACKOFF_SECONDS", 30.0)
        server = effect_server.EffectServer(client, FakeLease())
        path = server.open(jobdir)[effects.ENV]
        flaky = FlakyAccept(server._sock, [OSError(errno.EMFILE, "Too many")] * 5)
        server._sock = flaky
        serving = server._thread
        with pending_connection(path):
            wait_for(lambda: len(flaky.errors) == 4)  # in its 30 s back-off
            started = time.monotonic()
            server.close()
            assert not serving.is_alive() and time.monotonic() - started < 4
    logged = [r.getMessage() for r in caplog.records if "effect_accept_error" in r.getMessage()]
    assert "error=EBADF" in logged[0] and logged[0].endswith("retry=no")
    assert "error=EMFILE" in logged[1] and logged[1].endswith("retry=yes") and len(logged) == 2


def test_a_child_that_sends_nothing_or_too_much_and_waits_is_answered(served, monkeypatch):
    """A child that connects and sends no line within READ_TIMEOUT_SECONDS is answered 400;
    one that sends too much and holds its side open is read until the timeout, then
    answered 413 (not left waiting, nor reset)."""
    client, _lease, path = served
    monkeypatch.setattr(effect_server, "READ_TIMEOUT_SECONDS", 0.2)
    answer = raw_ask(path, b"", shut=False)
    assert answer["error"]["status"] == 400 and answer["error"]["code"] == "invalid_request"
    monkeypatch.setattr(effect_server, "REQUEST_MAX_BYTES", 1000)
    answer = raw_ask(path, b"x" * 2000, shut=False)
    assert answer["error"]["status"] == 413 and answer["error"]["code"] == "payload_too_large"
    # An empty request (connected, shut at once): one JSON object is expected.
    assert raw_ask(path, b"")["error"]["code"] == "invalid_request"
    assert client.calls == []


def test_a_child_gone_before_its_answer_is_no_error(tmp_path, caplog):
    """The child closes while the service is asked: its answer goes nowhere, quietly, and
    the ledger goes on serving."""
    client = BlockingClient()
    server = effect_server.EffectServer(client, FakeLease())
    with JobDir(str(tmp_path)) as jobdir, caplog.at_level(logging.INFO, "jobqueue.agent"):
        path = server.open(jobdir)[effects.ENV]
        try:
            with pending_connection(path) as sock:
                sock.sendall(b'{"op": "begin", "key": "k"}\n')
                wait_for(lambda: client.calls)
            client.go.set()
            wait_for(lambda: not server._handlers)
            assert effects.begin("k", path=path, timeout=30).state == "started"
        finally:
            server.close()
    messages = [r.getMessage() for r in caplog.records]
    assert sum("event=effect_begin" in m for m in messages) == 2
    assert not any("effect_error" in m for m in messages)


class UnencodableClient(FakeClient):
    def begin_effect(self, job_id, claim_id, key):
        self.calls.append(("begin", job_id, claim_id, key))
        return api.Effect(key, {"state": "committed", "effect_id": "e", "attempt": 1,
                                "result": {1, 2}})


def test_a_failure_past_the_answer_is_logged_and_the_agent_serves_on(tmp_path, caplog):
    """A bug after the answer was made (here an answer json cannot write) is logged; the
    child hears nothing (TransportError: asking again is safe); the slot is given back."""
    client = UnencodableClient()
    server = effect_server.EffectServer(client, FakeLease())
    with JobDir(str(tmp_path)) as jobdir, caplog.at_level(logging.ERROR, "jobqueue.agent"):
        path = server.open(jobdir)[effects.ENV]
        try:
            for _ in range(effect_server.MAX_CONNECTIONS + 1):  # a lost slot would hang the last
                with pytest.raises(api.TransportError, match="not JSON"):
                    effects.begin("k", path=path, timeout=10)
        finally:
            server.close()
    assert sum("event=effect_error" in r.getMessage() for r in caplog.records) == (
        effect_server.MAX_CONNECTIONS + 1)


@pytest.fixture
def agent_answering(tmp_path):
    """A stand-in agent on a Unix socket answering each connection with `answers[0]`."""
    path = str(tmp_path / "fake.sock")
    answers = []
    listener = effects.socket.socket(effects.socket.AF_UNIX, effects.socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(4)

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                effect_server.read_line(conn, 1 << 20)
                conn.sendall(answers[0])

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield path, answers
    listener.shutdown(effects.socket.SHUT_RDWR)
    listener.close()
    thread.join(timeout=5)


def test_an_agent_answer_that_is_not_an_object_is_a_transport_error(agent_answering):
    path, answers = agent_answering
    answers.append(b"[1]\n")
    with pytest.raises(api.TransportError, match="not a JSON object"):
        effects.begin("k", path=path, timeout=10)
    answers[0] = b'{"state": "started", "effect_id": "e"}\n'  # no attempt: not an Effect
    with pytest.raises(api.ServerError) as malformed:
        effects.begin("k", path=path, timeout=10)
    assert malformed.value.code == "invalid_response"


def test_the_command_in_process(served, monkeypatch, capsys, tmp_path):
    """jobqueue-effect's paths without a subprocess (the subprocess tests above replace the
    environment, so their coverage is not measured): --result-file (a file, a missing one,
    invalid JSON), a bad key, a refusal's exit status and message."""
    client, _lease, path = served
    monkeypatch.setenv(effects.ENV, path)
    assert effects.main(["begin", "k", "--print", "effect_id"]) == 0
    assert capsys.readouterr().out == "id-k\n"
    result = tmp_path / "result.json"
    result.write_text('{"n": 1}')
    assert effects.main(["commit", "k", "--result-file", str(result), "--print", "result"]) == 0
    assert capsys.readouterr().out == '{"n":1}\n'
    assert client.entries["k"]["result"] == {"n": 1}
    monkeypatch.setattr(effects.sys, "stdin", io.StringIO('{"n": 1}'))
    assert effects.main(["commit", "k", "--result-file", "-", "--print", "state"]) == 0
    assert capsys.readouterr().out == "committed\n"
    for argv, said in ((["commit", "k", "--result-file", str(tmp_path / "none")],
                        "--result-file: No such file or directory"),
                       (["commit", "k", "--result", "{"], "not valid JSON"),
                       (["begin", "a b"], "key must be")):
        with pytest.raises(SystemExit) as usage:
            effects.main(argv)
        assert usage.value.code == 2 and said in capsys.readouterr().err
    client.fail = [api.EffectAlreadyCommitted(409, "effect_already_committed", "another")]
    assert effects.main(["commit", "k", "--result", "2"]) == 6
    assert capsys.readouterr().err == "jobqueue-effect: 409 effect_already_committed: another\n"
    client.fail = [api.NotFound(404, "not_found", "Not found.")]
    assert effects.main(["begin", "k"]) == 3
