"""`jobqueue-agent`'s command line: option checks, and the signals it handles from its very
start (a SIGTERM while it is still starting is a clean stop, never the default action)."""

import logging
import os
import signal
import threading

import pytest
from jobqueue_client import cli

ENV = {"JOBQUEUE_SERVER": "http://127.0.0.1:9", "JOBQUEUE_WORKSPACE": "ws",
       "JOBQUEUE_AGENT": "ag", "JOBQUEUE_TOKEN": "jqa_0123456789ab_s", "JOBQUEUE_IDLE_MAX": "0.1"}


@pytest.fixture
def agent_env(monkeypatch):
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def own_signals():
    """main() installs SIGTERM/SIGINT handlers in this process: put the old ones back."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.mark.parametrize(("argv", "message"), [
    (["--concurrency", "two"], "not an integer: 'two'"),
    (["--concurrency", "0"], "must be at least 1"),
    (["--drain-timeout", "soon"], "not a number: 'soon'"),
    (["--kill-grace", "-1"], "must not be negative"),
    (["--idle-max", "x"], "not a number: 'x'"),
    (["--log-level", "LOUD"], "invalid choice: 'LOUD'"),
    (["--server", "127.0.0.1:8000"], "--server must be an http:// or https:// URL"),
])
def test_bad_options_exit_2_with_the_reason(agent_env, capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_a_sigterm_while_the_agent_starts_is_a_clean_stop(agent_env, own_signals, caplog,
                                                          monkeypatch):
    """Two signals arrive while the HTTP client is being built (before the agent exists):
    the agent starts already stopping, claims nothing and exits 0."""

    class SignalledWhileBuilt(cli.AgentClient):
        def __init__(self, *args, **kwargs):
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGINT)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(cli, "AgentClient", SignalledWhileBuilt)
    caplog.set_level(logging.INFO, logger="jobqueue.agent")
    assert cli.main([]) == 0
    assert "event=signal name=SIGTERM action=drain" in caplog.text
    assert "event=signal name=SIGINT action=abort_drain" in caplog.text
    assert "event=claim" not in caplog.text  # it never claimed
    assert "event=stopped exit_code=0" in caplog.text


def test_a_sigterm_while_it_runs_drains_and_exits_0(agent_env, own_signals, caplog):
    caplog.set_level(logging.INFO, logger="jobqueue.agent")

    def signal_once_running():
        for _ in range(600):
            if "event=claim_retry" in caplog.text:  # running, and nothing listens on :9
                break
            threading.Event().wait(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=signal_once_running, daemon=True).start()
    assert cli.main([]) == 0
    assert "event=claim_retry code=network_error" in caplog.text
    assert "event=signal name=SIGTERM action=drain" in caplog.text
    assert ENV["JOBQUEUE_TOKEN"] not in caplog.text


@pytest.mark.parametrize(("text", "error"), [("soon", "not an integer: 'soon'"),
                                             ("-1", "must not be negative")])
def test_wait_seconds_must_be_a_non_negative_integer(text, error):
    import argparse

    with pytest.raises(argparse.ArgumentTypeError, match=error):
        cli._non_negative_int(text)
    assert cli._non_negative_int("0") == 0


def test_the_agent_is_not_dumpable_and_its_jobs_children_are():
    """The agent closes its /proc/<pid>/environ, memory and ptrace to the jobs' children,
    which run as its user (PR_SET_DUMPABLE 0); a child is dumpable again once it execs."""
    import subprocess
    import sys

    get = "import ctypes; print(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))"  # PR_GET_DUMPABLE
    code = ("import subprocess, sys; from jobqueue_client.cli import not_dumpable; "
            f"assert not_dumpable(); {get}; "
            f"print(subprocess.run([sys.executable, '-c', {get!r}], capture_output=True, "
            "text=True, check=True).stdout.strip())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.split() == ["0", "1"]
