"""The effect ledger's channel between the reference agent and its child (effects.py), without
a server: the agent's EffectServer answers over the job directory's Unix socket with what its
client says, marks the lease lost when the service refuses the claim, retries a lost answer;
the child's side (ask / begin / run, `jobqueue-effect`) turns the answers into Effects, typed
errors and exit statuses. Against a real server and agent: tests/e2e/test_agent_effects.py."""

import json
import subprocess
import sys
import threading
import time

import pytest
from jobqueue_client import client as api
from jobqueue_client import effects
from jobqueue_client.runner import JobSpec, run_child
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


def test_a_lost_answer_is_asked_again_by_the_agent(served):
    client, _lease, path = served
    client.fail = [api.TransportError("reset"), api.ServerError(503, "unavailable", "")]
    assert effects.begin("charge-card", path=path).state == "started"
    assert len(client.calls) == 3


def test_without_a_socket_there_is_no_ledger(monkeypatch, tmp_path):
    monkeypatch.delenv(effects.ENV, raising=False)
    with pytest.raises(effects.NoLedger):
        effects.begin("charge-card")
    with pytest.raises(api.TransportError):  # named, but nobody listens
        effects.begin("charge-card", path=str(tmp_path / "gone.sock"))


def test_a_socket_path_too_long_for_sun_path_still_works(tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    client, lease = FakeClient(), FakeLease()
    server = effects.EffectServer(client, lease)
    with JobDir(str(deep)) as jobdir:
        path = server.open(jobdir)[effects.ENV]
        try:
            assert len(path) > effects.SUN_PATH_MAX
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


def test_the_childs_path_leads_to_the_command(tmp_path, monkeypatch):
    scripts, other = tmp_path / "venv-bin", tmp_path / "other"
    scripts.mkdir()
    other.mkdir()
    monkeypatch.setattr(effects.sysconfig, "get_path", lambda name: str(scripts))
    assert effects.command_path("/usr/bin:/bin") == "/usr/bin:/bin"  # not installed there
    (scripts / "jobqueue-effect").write_text("#!/bin/sh\n")
    (scripts / "jobqueue-effect").chmod(0o755)
    assert effects.command_path("/usr/bin:/bin") == f"/usr/bin:/bin:{scripts}"  # appended
    assert effects.command_path("") == str(scripts)
    (other / "jobqueue-effect").write_text("#!/bin/sh\n")
    (other / "jobqueue-effect").chmod(0o755)
    assert effects.command_path(f"{other}:/bin") == f"{other}:/bin"  # found: unchanged


def test_closing_does_not_wait_for_a_timer(tmp_path):
    """The job's end is not held up by the ledger's thread (it waits on the socket and a
    wake-up pipe; a 0.2 s accept poll once added ~150 ms to every job)."""
    took = []
    for _ in range(5):
        server = effects.EffectServer(FakeClient(), FakeLease())
        with JobDir(str(tmp_path)) as jobdir:
            server.open(jobdir)
            time.sleep(0.02)
            started = time.perf_counter()
            server.close()
            took.append(time.perf_counter() - started)
            assert server._sock is None and server._thread is None
    assert min(took) < 0.05, took
