"""The agent's config file (jobqueue_client/agentconfig.py), its token rotation thread
(rotation.py) and `jobqueue-agent register`'s option checks: what the e2e tests
(tests/e2e/test_agent_registration.py) do not reach without a server that fails on purpose."""

import json
import os
import stat
import threading
import time

import pytest
from jobqueue_client import agentconfig, cli, rotation
from jobqueue_client.client import AgentClient
from jobqueue_client.errors import AuthError, ServerError, TransportError

CONFIG = agentconfig.AgentConfig(server="http://127.0.0.1:9", workspace="ws", agent="ag",
                                 token="jqa_0123456789ab_secret", name="n", labels=("a",))


def test_save_and_load_keep_every_field_in_a_0600_file_and_leave_no_temporary(tmp_path):
    path = tmp_path / "agent.json"
    fresh = CONFIG.with_token("jqa_0123456789ab_new", "2030-01-01T00:00:00Z",
                              "Tue, 31 Dec 2029 23:00:00 GMT", received_at=1000.0)
    agentconfig.save(path, fresh)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert agentconfig.load(path) == fresh
    assert fresh.token_lifetime_seconds == 3600 and fresh.rotate_after() == 1000 + 2700
    assert "secret" not in repr(CONFIG) and "new" not in repr(fresh)
    agentconfig.save(path, CONFIG)  # replaced whole
    assert agentconfig.load(path) == CONFIG and CONFIG.rotate_after() is None
    assert [p.name for p in tmp_path.iterdir()] == ["agent.json"]


def test_a_failed_save_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "agent.json"
    target.mkdir()  # os.replace cannot put a file over a directory
    with pytest.raises(OSError):
        agentconfig.save(target, CONFIG)
    assert [p.name for p in tmp_path.iterdir()] == ["agent.json"] and target.is_dir()


@pytest.mark.parametrize(("content", "message"), [
    (None, "no config file"), ("{", "is not JSON"), ("[]", "is not a JSON object"),
    ('{"server": "s", "workspace": "w", "agent": ""}', "lacks agent, token"),
    (b"\xff\xfe", "cannot read"), ("dir", "cannot read"),
])
def test_a_bad_config_file_is_named_never_quoted(tmp_path, content, message):
    path = tmp_path / "agent.json"
    if content == "dir":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(agentconfig.ConfigError, match=message) as caught:
        agentconfig.load(path)
    assert "{" not in str(caught.value).replace(str(path), "")


def test_a_lifetime_is_read_against_the_servers_date_else_this_clock():
    assert agentconfig.lifetime_seconds(None, "x") is None
    assert agentconfig.lifetime_seconds("2030-01-01T00:00:00+00:00",
                                        "Tue, 31 Dec 2029 23:59:00 GMT") == 60
    far = agentconfig.lifetime_seconds("2999-01-01T00:00:00Z", "not a date")
    assert far > 10 ** 9
    # A Date without a zone (-0000) is no measure either: this machine's clock.
    assert agentconfig.lifetime_seconds("2999-01-01T00:00:00Z",
                                        "Tue, 31 Dec 2029 23:59:00 -0000") > 10 ** 9
    assert agentconfig.lifetime_seconds("2000-01-01T00:00:00Z", None) == 0


class FakeClient:
    """Stands for the server's rotate endpoint: answers (or raises) from a script."""

    def __init__(self, *outcomes):
        self.outcomes = list(outcomes)
        self.tokens = []
        self.calls = 0

    def rotate_token(self, overlap_seconds):
        self.calls += 1
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome, "Tue, 31 Dec 2999 23:59:50 GMT"

    def set_token(self, token):
        self.tokens.append(token)


def _answer(n):
    return {"token": f"jqa_0123456789ab_t{n}", "token_expires_at": "3000-01-01T00:00:00Z",
            "previous_token_expires_at": "2999-12-31T23:59:59Z"}


def test_the_rotator_stores_before_it_sends_and_retries_what_may_pass(tmp_path, monkeypatch):
    monkeypatch.setattr(rotation, "RETRY_MIN_SECONDS", 0.01)
    path = tmp_path / "agent.json"
    due = CONFIG.with_token(CONFIG.token, "2999-12-31T23:59:54Z",
                            "Tue, 31 Dec 2999 23:59:50 GMT", received_at=time.time() - 10)
    agentconfig.save(path, due)
    stored_first = []
    client = FakeClient(TransportError("lost"), ServerError(503, "database_unavailable", "x"),
                        _answer(1), AuthError(401, "token_expired", "x"))
    original = client.set_token

    def set_token(token):
        stored_first.append(agentconfig.load(path).token == token)
        original(token)

    client.set_token = set_token
    rotator = rotation.TokenRotator(client, path, due).start()
    deadline = time.time() + 10
    while not client.tokens and time.time() < deadline:
        time.sleep(0.01)
    assert client.calls == 3
    assert client.tokens == [_answer(1)["token"]] and stored_first == [True]
    assert agentconfig.load(path).token == _answer(1)["token"]
    assert rotator.rotations == 1
    rotator.stop()


def test_the_rotator_gives_up_on_a_refusal_and_stops_at_once(tmp_path):
    path = tmp_path / "agent.json"
    due = CONFIG.with_token(CONFIG.token, "2000-01-01T00:00:00Z", None, received_at=0.0)
    agentconfig.save(path, due)
    client = FakeClient(AuthError(401, "token_expired", "x"))
    rotator = rotation.TokenRotator(client, path, due).start()
    rotator._thread.join(5)
    assert not rotator._thread.is_alive() and client.tokens == []
    # Not due for a long time: stop() ends the wait at once; a token that never expires
    # starts no thread at all.
    later = CONFIG.with_token(CONFIG.token, "2999-01-01T00:00:00Z", None)
    waiting = rotation.TokenRotator(FakeClient(), path, later).start()
    started = time.monotonic()
    waiting.stop()
    assert time.monotonic() - started < 5 and not waiting._thread.is_alive()
    idle = rotation.TokenRotator(FakeClient(), path, CONFIG).start()
    assert not idle._thread.is_alive()
    idle.stop()


def test_the_rotator_waits_out_a_retry_unless_stopped(tmp_path):
    path = tmp_path / "agent.json"
    due = CONFIG.with_token(CONFIG.token, "2000-01-01T00:00:00Z", None, received_at=0.0)
    client = FakeClient(TransportError("lost"))
    rotator = rotation.TokenRotator(client, path, due).start()
    while client.calls < 1:
        time.sleep(0.01)
    rotator.stop()  # during the retry's wait
    assert not rotator._thread.is_alive()


def test_set_token_reaches_the_held_wait_connection_too():
    client = AgentClient("http://127.0.0.1:9", "ws", "ag", "jqa_0123456789ab_old")
    held = client._waiting_client()
    client.set_token("jqa_0123456789ab_new")
    assert client._http.headers["Authorization"] == "Bearer jqa_0123456789ab_new"
    assert held.headers["Authorization"] == "Bearer jqa_0123456789ab_new"
    client.close()


@pytest.mark.parametrize(("argv", "message"), [
    (["--name", "n", "--config", "c"], "missing --server"),
    (["--server", "127.0.0.1:1", "--registration-token", "t", "--name", "n", "--config", "c"],
     "must be an http:// or https:// URL"),
    (["--server", "http://127.0.0.1:9", "--registration-token", "t", "--name", "n",
      "--config", "EXISTS"], "exists: pass --force"),
])
def test_register_options_exit_2_with_the_reason(tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.delenv("JOBQUEUE_SERVER", raising=False)
    monkeypatch.delenv("JOBQUEUE_REGISTRATION_TOKEN", raising=False)
    (tmp_path / "EXISTS").write_text("{}")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as caught:
        cli.main(["register", *argv])
    assert caught.value.code == 2 and message in capsys.readouterr().err


def test_register_against_no_server_exits_1_and_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("JOBQUEUE_REGISTRATION_TOKEN", "jqr_0123456789ab_secret")
    config = tmp_path / "agent.json"
    code = cli.main(["register", "--server", "http://127.0.0.1:9", "--name", "n",
                     "--config", str(config)])
    err = capsys.readouterr().err
    assert code == 1 and "cannot be reached" in err and "secret" not in err
    assert not config.exists()


def test_a_bad_config_file_exits_2(tmp_path, capsys, monkeypatch):
    for name in ("JOBQUEUE_SERVER", "JOBQUEUE_WORKSPACE", "JOBQUEUE_AGENT", "JOBQUEUE_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "agent.json").write_text(json.dumps({"server": "http://127.0.0.1:9"}))
    with pytest.raises(SystemExit) as caught:
        cli.main(["--config", str(tmp_path / "agent.json")])
    assert caught.value.code == 2 and "lacks workspace, agent, token" in capsys.readouterr().err


def test_the_rotator_thread_is_a_daemon():
    rotator = rotation.TokenRotator(FakeClient(), "x", CONFIG)
    assert rotator._thread.daemon and isinstance(rotator._thread, threading.Thread)


def test_a_file_that_cannot_be_written_is_retried_then_the_token_stored(tmp_path, monkeypatch):
    monkeypatch.setattr(rotation, "RETRY_MIN_SECONDS", 0.01)
    path = tmp_path / "agent.json"
    due = CONFIG.with_token(CONFIG.token, "2999-12-31T23:59:54Z",
                            "Tue, 31 Dec 2999 23:59:50 GMT", received_at=time.time() - 10)
    real_save, failures = agentconfig.save, []

    def save(where, config):
        if not failures:
            failures.append(1)
            raise OSError(28, "No space left on device")
        real_save(where, config)

    monkeypatch.setattr(agentconfig, "save", save)
    client = FakeClient(_answer(1), _answer(2))
    rotator = rotation.TokenRotator(client, path, due).start()
    deadline = time.time() + 10
    while not client.tokens and time.time() < deadline:
        time.sleep(0.01)
    rotator.stop()
    # The first answer's token was never stored, so never sent; the second one was both.
    assert client.calls == 2 and client.tokens == [_answer(2)["token"]]
    assert json.loads(path.read_text())["token"] == _answer(2)["token"]


def test_register_refuses_a_config_path_it_cannot_write_before_registering(tmp_path, capsys):
    code = None
    with pytest.raises(SystemExit) as caught:
        cli.main(["register", "--server", "http://127.0.0.1:9", "--registration-token", "t",
                  "--name", "n", "--config", str(tmp_path / "missing" / "agent.json")])
    code = caught.value.code
    assert code == 2 and "cannot write" in capsys.readouterr().err


def test_what_an_interrupted_save_left_is_removed(tmp_path):
    path = tmp_path / "agent.json"
    agentconfig.save(path, CONFIG)
    (tmp_path / ".agent.json.abc123.tmp").write_text("{}")
    (tmp_path / "other.tmp").write_text("kept")
    assert agentconfig.remove_temporaries(path) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["agent.json", "other.tmp"]


def test_a_far_expiry_is_waited_for_in_steps(tmp_path, monkeypatch):
    monkeypatch.setattr(rotation, "MAX_WAIT_SECONDS", 0.01)
    far = CONFIG.with_token(CONFIG.token, "2999-01-01T00:00:00Z", None)
    rotator = rotation.TokenRotator(FakeClient(), tmp_path / "a.json", far).start()
    time.sleep(0.1)  # several steps: not due, nothing asked
    rotator.stop()
    assert not rotator._thread.is_alive() and rotator.client.calls == 0


def test_an_option_wins_over_the_config_file(tmp_path, capsys, monkeypatch):
    for name in ("JOBQUEUE_SERVER", "JOBQUEUE_WORKSPACE", "JOBQUEUE_AGENT", "JOBQUEUE_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    agentconfig.save(tmp_path / "agent.json", CONFIG)
    with pytest.raises(SystemExit) as caught:  # the option's server, not the file's, is read
        cli.main(["--config", str(tmp_path / "agent.json"), "--server", "127.0.0.1:8000"])
    assert caught.value.code == 2 and "--server must be an http" in capsys.readouterr().err
