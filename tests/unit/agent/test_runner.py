"""The agent's pieces that need no server: backoff, config, the child process, the CLI."""

import json
import os
import random
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from jobqueue_client import cli
from jobqueue_client.backoff import Backoff
from jobqueue_client.child import OUTPUT_BUFFER_BYTES, OUTPUT_TAIL_CHARS, run_child
from jobqueue_client.jobspec import ConfigError, JobSpec, parse_config

ROOT = Path(__file__).resolve().parents[3]


def sh(script, timeout=None, env=None):
    return JobSpec(command=["sh", "-c", script], env=env or {}, timeout_seconds=timeout)


def run(spec, context=None, stop=None, **kw):
    return run_child(spec, job_id="job-1", attempt=2, context=context or {},
                     stop=stop or threading.Event(), **kw)


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie waiting for its reaper is gone for our purposes.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


# --- backoff -------------------------------------------------------------------------------


def test_backoff_grows_with_jitter_up_to_the_cap_and_resets():
    b = Backoff(base=0.2, cap=5.0, rng=random.Random(7))
    delays = [b.next() for _ in range(12)]
    ceilings = [min(5.0, 0.2 * 2**n) for n in range(12)]
    for delay, ceiling in zip(delays, ceilings, strict=True):
        assert ceiling / 2 <= delay <= ceiling
    assert max(delays) <= 5.0 and delays[-1] >= 2.5
    assert len({round(d, 6) for d in delays[6:]}) > 1  # jittered, not lockstep
    b.reset()
    assert b.next() <= 0.2


def test_backoff_rejects_nonsense():
    with pytest.raises(ValueError):
        Backoff(base=0, cap=1)
    with pytest.raises(ValueError):
        Backoff(base=2, cap=1)


# --- job_agent_config -----------------------------------------------------------------------


def test_parse_config_accepts_the_documented_shape():
    spec = parse_config({"command": ["echo", "hi"], "env": {"A": "1"}, "timeout_seconds": 3})
    assert spec == JobSpec(command=["echo", "hi"], env={"A": "1"}, timeout_seconds=3.0)
    assert parse_config({"command": ["true"]}).timeout_seconds is None


@pytest.mark.parametrize("config", [
    None, [], {}, {"command": "echo hi"}, {"command": []}, {"command": [""]},
    {"command": ["echo", 1]}, {"command": ["true"], "env": {"A": 1}},
    {"command": ["true"], "env": ["A=1"]}, {"command": ["true"], "env": {"A=B": "1"}},
    {"command": ["true"], "timeout_seconds": 0}, {"command": ["true"], "timeout_seconds": "5"},
    {"command": ["true"], "timeout_seconds": True},
])
def test_parse_config_refuses_bad_shapes(config):
    with pytest.raises(ConfigError):
        parse_config(config)


# --- the child -----------------------------------------------------------------------------


def test_exit_zero_is_success_and_the_result_file_becomes_the_result():
    out = run(sh('echo "working on $JOB_ID/$JOB_ATTEMPT"; '
                 'printf \'{"rows": 3}\' > "$JOB_RESULT_FILE"'))
    assert out.succeeded and out.returncode == 0
    assert out.result == {"rows": 3}
    assert "working on job-1/2" in out.output_tail


def test_the_claims_fencing_token_is_in_the_childs_environment():
    out = run(sh('echo "token=${JOB_FENCING_TOKEN-unset}"'), fencing_token="h.p.s")
    assert "token=h.p.s" in out.output_tail
    out = run(sh('echo "token=${JOB_FENCING_TOKEN-unset}"'))  # an older server: none
    assert "token=unset" in out.output_tail


def test_non_zero_exit_is_failure_with_the_output_tail_as_message():
    out = run(sh("echo first; echo boom >&2; exit 3"))
    assert not out.succeeded and out.returncode == 3
    assert out.message().startswith("exit status 3")
    assert "first" in out.message() and "boom" in out.message()


def test_the_message_keeps_only_the_tail_of_a_long_output():
    out = run(sh("i=0; while [ $i -lt 3000 ]; do echo line-$i; i=$((i+1)); done; exit 1"))
    assert len(out.output_tail) == OUTPUT_TAIL_CHARS
    assert out.output_tail.rstrip().endswith("line-2999")
    assert "line-0\n" not in out.output_tail


def test_timeout_stops_the_whole_process_group(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    spec = sh(f'sleep 30 & echo $! > {pidfile}; echo started; wait', timeout=0.5)
    out = run(spec, kill_grace=1)
    assert out.timed_out and not out.succeeded
    assert out.message().startswith("timed out") and "started" in out.message()
    assert not pid_alive(int(pidfile.read_text()))


def test_stop_event_terminates_then_kills_a_child_that_ignores_sigterm(tmp_path):
    marker = tmp_path / "pid"
    stop = threading.Event()
    spec = sh(f"trap '' TERM; echo $$ > {marker}; while true; do sleep 0.1; done")
    threading.Timer(0.3, stop.set).start()
    out = run(spec, stop=stop, kill_grace=0.5)
    assert out.stopped and not out.succeeded
    assert out.returncode == -signal.SIGKILL
    assert not pid_alive(int(marker.read_text()))


def test_context_file_is_private_named_by_env_and_removed_afterwards(tmp_path):
    seen = tmp_path / "seen.json"
    script = (
        "import json, os, stat, sys\n"
        "p = os.environ['JOB_CONTEXT_FILE']\n"
        "st = os.stat(p)\n"
        "json.dump({'path': p, 'mode': stat.S_IMODE(st.st_mode),\n"
        "           'dir_mode': stat.S_IMODE(os.stat(os.path.dirname(p)).st_mode),\n"
        "           'context': json.load(open(p)), 'argv': open('/proc/self/cmdline').read(),\n"
        "           'token': os.environ.get('JOBQUEUE_TOKEN'), 'mine': os.environ['MINE']},\n"
        f"          open({str(seen)!r}, 'w'))\n"
    )
    secret = {"password": "hunter2-very-secret", "nested": {"k": [1, 2]}}
    os.environ["JOBQUEUE_TOKEN"] = "jqa_shouldnotleak"
    try:
        out = run(JobSpec([sys.executable, "-c", script], {"MINE": "yes"}, None), context=secret)
    finally:
        del os.environ["JOBQUEUE_TOKEN"]
    assert out.succeeded, out.message()
    info = json.loads(seen.read_text())
    assert info["context"] == secret
    assert info["mode"] == 0o600 and info["dir_mode"] == 0o700
    assert "hunter2" not in info["argv"]
    assert info["token"] is None and info["mine"] == "yes"
    assert not os.path.exists(info["path"]) and not os.path.exists(os.path.dirname(info["path"]))
    assert "hunter2" not in out.output_tail


def test_a_result_file_that_is_not_json_makes_the_job_fail():
    out = run(sh('echo "not json" > "$JOB_RESULT_FILE"'))
    assert out.returncode == 0 and not out.succeeded
    assert out.result is None and "not valid JSON" in out.message()


def test_a_command_that_cannot_start_fails_cleanly():
    out = run(JobSpec(["/nonexistent/program"], {}, None))
    assert not out.succeeded and out.start_error
    assert out.message().startswith("could not start the command")


def test_the_job_env_cannot_override_the_job_variables():
    out = run(sh('printf \'"%s"\' "$JOB_ID" > "$JOB_RESULT_FILE"', env={"JOB_ID": "forged"}))
    assert out.result == "job-1"


# --- packaging and the command line ---------------------------------------------------------


def test_the_agent_imports_without_django():
    code = ("import sys, jobqueue_client.cli, jobqueue_client.runner, jobqueue_client.client;"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('django', 'jobqueue')];"
            "print(bad); sys.exit(1 if bad else 0)")
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_cli_reports_missing_options_and_exits_2(monkeypatch, capsys):
    for name in cli.ENV.values():
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit) as exc:
        cli.main(["--server", "http://127.0.0.1:1"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--workspace (JOBQUEUE_WORKSPACE)" in err and "--token (JOBQUEUE_TOKEN)" in err
    assert "--server" not in err.split("missing", 1)[1]


def test_cli_reads_every_option_from_the_environment(monkeypatch):
    monkeypatch.setenv("JOBQUEUE_SERVER", "http://127.0.0.1:9")
    monkeypatch.setenv("JOBQUEUE_WORKSPACE", "ws")
    monkeypatch.setenv("JOBQUEUE_AGENT", "ag")
    monkeypatch.setenv("JOBQUEUE_TOKEN", "jqa_x")
    monkeypatch.setenv("JOBQUEUE_CONCURRENCY", "4")
    monkeypatch.setenv("JOBQUEUE_DRAIN_TIMEOUT", "2.5")
    args = cli.build_parser().parse_args([])
    assert (args.server, args.workspace, args.agent, args.token) == (
        "http://127.0.0.1:9", "ws", "ag", "jqa_x")
    assert args.concurrency == 4 and args.drain_timeout == 2.5
    assert cli.build_parser().parse_args(["--concurrency", "2"]).concurrency == 2


def test_cli_rejects_bad_numbers(monkeypatch, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.build_parser().parse_args(["--concurrency", "0"])
    assert exc.value.code == 2
    assert "at least 1" in capsys.readouterr().err


def test_the_entry_point_is_installed_and_documents_every_option():
    script = Path(sys.executable).with_name("jobqueue-agent")
    assert script.exists(), "run `make install` (pip install -e .) to get the entry point"
    proc = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for option in ("--server", "--workspace", "--agent", "--token", "--concurrency",
                   "--drain-timeout", "JOBQUEUE_TOKEN"):
        assert option in proc.stdout


def test_lease_deadline_uses_the_servers_clock_difference_not_ours():
    import datetime as dt

    from jobqueue_client.client import Claim
    from jobqueue_client.lease import Lease

    server_now = dt.datetime(2001, 1, 1, tzinfo=dt.UTC)  # far from this machine's clock
    claim = Claim(job={"id": "j"}, claim_id="c", attempt=1, lease_seconds=30,
                  heartbeat_interval_seconds=10, server_time=server_now,
                  claim_expires_at=server_now + dt.timedelta(seconds=30))
    lease = Lease(claim, sent_at=1000.0)
    assert lease.deadline == 1030.0 and lease.interval == 10
    lease.renewed(sent_at=1020.0, remaining=30)
    assert lease.deadline == 1050.0 and lease.next_due == 1030.0
    assert lease.mark_lost("claim_superseded") and not lease.mark_lost("job_finished")
    assert lease.lost_code == "claim_superseded" and lease.stop_child.is_set()


def test_output_beyond_the_buffer_keeps_only_its_tail():
    """200 KiB of output: the agent keeps a bounded buffer and reports the last characters."""
    script = "i=0; while [ $i -lt 2000 ]; do printf '%0100d\\n' $i; i=$((i+1)); done; echo END"
    outcome = run(sh(script))
    assert outcome.succeeded
    assert len(outcome.output_tail) == OUTPUT_TAIL_CHARS
    assert outcome.output_tail.endswith("00001999\nEND\n")


@pytest.mark.parametrize("reads", [
    [OUTPUT_BUFFER_BYTES, 100],  # a full-size read, then a short last one
    [OUTPUT_BUFFER_BYTES + 10, 3539],
    [1000] * 200,
    [10],
])
def test_the_output_buffer_always_keeps_the_whole_tail(reads):
    """However the pipe's reads fall, the buffer keeps the last OUTPUT_BUFFER_BYTES (or all
    there was): an eviction never leaves a short last read alone."""
    import io

    from jobqueue_client.child import _Tail

    data = b"".join(bytes([65 + i % 26]) * n for i, n in enumerate(reads))

    class Pipe(io.BytesIO):
        def __init__(self):
            super().__init__()
            self.reads = list(reads)

        def read1(self, _size=-1):
            return b"" if not self.reads else bytes(
                data[sum(reads[:len(reads) - len(self.reads)]):][:self.reads.pop(0)])

    tail = _Tail()
    tail.drain(Pipe())
    kept = tail.text().encode()
    assert data.endswith(kept) and len(kept) >= min(len(data), OUTPUT_BUFFER_BYTES)
    assert len(kept) <= OUTPUT_BUFFER_BYTES + max(reads)


def test_a_result_file_over_the_cap_makes_the_job_fail(monkeypatch):
    from jobqueue_client import child

    monkeypatch.setattr(child, "RESULT_FILE_MAX_BYTES", 10)
    outcome = run(sh('echo \'{"much": "more than ten bytes"}\' > "$JOB_RESULT_FILE"'))
    assert not outcome.succeeded and outcome.result is None
    assert outcome.message() == "JOB_RESULT_FILE is larger than 10 bytes"


def test_a_result_file_that_is_a_directory_makes_the_job_fail():
    outcome = run(sh('mkdir "$JOB_RESULT_FILE"'))
    assert not outcome.succeeded
    assert outcome.message() == "JOB_RESULT_FILE is a directory, not a regular file"


def test_on_start_sees_the_child_and_a_finished_child_needs_no_signal():
    from jobqueue_client.child import stop_process_group

    seen = []
    outcome = run(sh("exit 0"), on_start=seen.append)
    [proc] = seen
    assert outcome.succeeded and proc.returncode == 0
    stop_process_group(proc, grace=5)  # already gone: returns at once, raises nothing
    assert proc.returncode == 0


# --- the summary fits the server's message cap (#17 item 6) -------------------------------


def test_a_message_that_fits_is_sent_unchanged():
    from jobqueue_client.child import MESSAGE_MAX_BYTES, fit_message

    assert MESSAGE_MAX_BYTES == 64 * 1024
    text = "é" * (MESSAGE_MAX_BYTES // 2)  # exactly the cap in UTF-8
    assert fit_message(text) is text


def test_a_long_message_keeps_its_start_and_its_end_within_the_cap():
    from jobqueue_client.child import MESSAGE_MAX_BYTES, TRUNCATION_MARK, fit_message

    text = "exit status 1\n" + "".join(f"line-{i} é€😀\n" for i in range(20_000))
    cut = fit_message(text)
    assert len(cut.encode()) <= MESSAGE_MAX_BYTES
    assert len(cut.encode()) > MESSAGE_MAX_BYTES - 8  # no more lost than a cut character
    assert cut.startswith("exit status 1\nline-0 ")
    assert cut.endswith("line-19999 é€😀\n")
    assert TRUNCATION_MARK in cut and "\ufffd" not in cut


def test_a_tiny_cap_still_holds():
    from jobqueue_client.child import fit_message

    assert fit_message("€" * 100, limit=10) == "€" * 3
    cut = fit_message("x" * 100, limit=40)
    assert len(cut.encode()) <= 40 and cut.startswith("x") and cut.endswith("x")
