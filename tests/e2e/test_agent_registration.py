"""The reference agent registers itself and rotates its own token (#28 items 2 and 3, the
agent's part; docs/cli.md "Registering an agent"): `jobqueue-agent register` writes a config
file (mode 0600) that `jobqueue-agent --config FILE` runs with; the agent rotates the file's
token at 75 % of its lifetime, replacing the file atomically; a SIGKILL at any moment leaves a
working token in the file. Real server and agent processes; no token in any output."""

import json
import os
import signal
import stat
import subprocess
import sys

import httpx
import pytest

from agents import registration
from jobqueue import states
from jobqueue.models import Job, JobAgent, Workspace

from .harness import ROOT, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def _register_cli(stack, raw, name, config, *labels, extra=()):
    argv = [sys.executable, "-m", "jobqueue_client.cli", "register", "--server", stack.url,
            "--name", name, "--config", str(config), *extra]
    for label in labels:
        argv += ["--label", label]
    env = stack.env(JOBQUEUE_REGISTRATION_TOKEN=raw)
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def _start(stack, config, name, **env):
    # Polling, not long-poll: a killed agent's held claim-next would stay held on the server
    # and could take the next job for nobody (until its lease ends and the reaper runs).
    argv = [sys.executable, "-m", "jobqueue_client.cli", "--config", str(config),
            "--idle-max", "0.3", "--wait-seconds", "0", "--drain-timeout", "5",
            "--log-level", "DEBUG"]
    tmpdir = stack.tmp / f"tmp-{name}"
    tmpdir.mkdir(exist_ok=True)
    proc = stack._spawn(f"agent-{name}", argv, stack.env(TMPDIR=tmpdir, E2E_AGENT=name, **env),
                        ready_line="event=started ")
    return proc


def _works(stack, config_path) -> bool:
    """Whether the token in the config file opens the agent's own endpoint now."""
    config = json.loads(config_path.read_text())
    r = httpx.get(f"{stack.url}/v1/workspaces/{config['workspace']}/job-agents/"
                  f"{config['agent']}/jobs", headers={"Authorization": f"Bearer {config['token']}"})
    return r.status_code == 200


def _job(stack, agent_id):
    agent = JobAgent.objects.get(id=agent_id)
    from jobqueue import lifecycle

    return lifecycle.create_job(workspace=agent.workspace, job_agent=agent,
                                job_agent_config={"command": stack.command()}).job


def test_an_agent_registers_runs_with_its_config_and_never_shows_its_token(stack, tmp_path):
    workspace = Workspace.objects.create(name="fleet")
    row, raw = registration.issue(workspace.id, labels=["linux", "gpu"], max_uses=1)
    config = tmp_path / "agent.json"
    done = _register_cli(stack, raw, "runner-1", config, "linux")
    assert done.returncode == 0, done.stderr
    saved = json.loads(config.read_text())
    assert stat.S_IMODE(os.stat(config).st_mode) == 0o600
    assert saved["token"].startswith("jqa_") and saved["labels"] == ["linux"]
    assert saved["server"] == stack.url and saved["workspace"] == str(workspace.id)
    assert saved["token"] not in done.stdout + done.stderr and raw not in done.stdout
    assert saved["agent"] in done.stdout
    # Used up: a second registration is refused, exit 1, nothing written.
    again = _register_cli(stack, raw, "runner-2", tmp_path / "other.json")
    assert again.returncode == 1 and "registration_token_invalid" in again.stderr
    assert not (tmp_path / "other.json").exists()
    # An existing config is not replaced without --force.
    kept = _register_cli(stack, raw, "runner-3", config)
    assert kept.returncode == 2 and json.loads(config.read_text()) == saved
    # The agent runs with the file alone and does a job.
    agent = _start(stack, config, "runner-1").wait_ready()
    job = _job(stack, saved["agent"])
    wait_for(lambda: Job.objects.get(id=job.id).status == states.SUCCESSFUL, 60,
             "the registered agent's job", on_fail=stack.logs)
    assert saved["token"] not in agent.output()
    assert JobAgent.objects.get(id=saved["agent"]).labels == ["linux"]


def test_the_agent_rotates_its_token_before_it_expires(stack, tmp_path):
    workspace = Workspace.objects.create(name="rotating")
    row, raw = registration.issue(workspace.id, token_ttl_seconds=4)
    config = tmp_path / "agent.json"
    assert _register_cli(stack, raw, "rotor", config).returncode == 0
    first = json.loads(config.read_text())
    agent = _start(stack, config, "rotor").wait_ready()
    # Rotated at 75 % of 4 s, again and again: the file always holds a working token.
    tokens = {first["token"]}

    def rotated_twice():
        tokens.add(json.loads(config.read_text())["token"])
        return len(tokens) >= 3

    wait_for(rotated_twice, 30, "two rotations", on_fail=stack.logs)
    assert agent.alive() and _works(stack, config)
    assert stat.S_IMODE(os.stat(config).st_mode) == 0o600
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".agent.json.")]
    # The agent keeps working with each new token: a job after the rotations.
    job = _job(stack, first["agent"])
    wait_for(lambda: Job.objects.get(id=job.id).status == states.SUCCESSFUL, 60,
             "a job after the rotations", on_fail=stack.logs)
    assert "event=token_rotated" in agent.output()
    for token in tokens:
        assert token not in agent.output()


class HoldingProxy:
    """An HTTP proxy in this process between the agent and the server: it forwards every
    request, and while `hold_rotation` is set it forwards a token rotation to the server and
    then keeps the answer (the server has rotated; the agent never hears of it), which is the
    moment a SIGKILL is worst."""

    def __init__(self, upstream: str):
        import http.server
        import threading

        self.upstream = upstream
        self.hold_rotation = threading.Event()
        self.rotated_upstream = threading.Event()
        self.release = threading.Event()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _forward(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("host", "content-length", "connection")}
                with httpx.Client(timeout=70) as http:
                    answer = http.request(self.command, proxy.upstream + self.path,
                                          content=body, headers=headers)
                if self.path.endswith("/tokens/rotate") and proxy.hold_rotation.is_set():
                    proxy.rotated_upstream.set()
                    proxy.release.wait(60)  # the agent is killed meanwhile
                    return
                data = answer.content
                self.send_response(answer.status_code)
                for key, value in answer.headers.items():
                    if key.lower() not in ("content-length", "transfer-encoding", "connection",
                                           "content-encoding"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def test_a_sigkill_during_rotation_never_leaves_the_agent_without_a_working_token(
        stack, tmp_path):
    """The worst moment: the server has rotated the token, the agent has not heard (nor
    written the file) and is killed. The file's token still works; the agent started again
    rotates again (the server revokes the successor nobody received) and works on. Then a kill
    right after a rotation wrote the file: the new token is there and works."""
    workspace = Workspace.objects.create(name="killed")
    row, raw = registration.issue(workspace.id, token_ttl_seconds=8)
    config = tmp_path / "agent.json"
    assert _register_cli(stack, raw, "victim", config).returncode == 0
    first = json.loads(config.read_text())
    proxy = HoldingProxy(stack.url)
    try:
        proxy.hold_rotation.set()
        proc = _start(stack, config, "victim", JOBQUEUE_SERVER=proxy.url)
        # (the environment's server wins over the file's: it talks through the proxy)
        proc.wait_ready()
        assert proxy.rotated_upstream.wait(30), stack.logs()
        proc.signal(signal.SIGKILL)
        proc.popen.wait(timeout=10)
        assert json.loads(config.read_text())["token"] == first["token"]  # never heard
        assert _works(stack, config)
        # Started again, straight to the server: rotation is due, so it rotates at once.
        agent = _start(stack, config, "victim").wait_ready()
        wait_for(lambda: json.loads(config.read_text())["token"] != first["token"], 30,
                 "the rotation after the restart", on_fail=stack.logs)
        assert _works(stack, config)
        from agents.models import AgentToken

        tokens = AgentToken.objects.filter(job_agent_id=first["agent"])
        assert tokens.count() == 3  # the first, the lost one, the one in the file
        assert tokens.filter(revoked_at__isnull=False).count() == 1  # the lost one
        # A kill right after a rotation wrote the file: the file's (new) token works.
        second = json.loads(config.read_text())["token"]
        wait_for(lambda: json.loads(config.read_text())["token"] != second, 30,
                 "the next rotation", interval=0.005, on_fail=stack.logs)
        agent.signal(signal.SIGKILL)
        agent.popen.wait(timeout=10)
        assert _works(stack, config)
        agent = _start(stack, config, "victim").wait_ready()
        job = _job(stack, first["agent"])
        wait_for(lambda: Job.objects.get(id=job.id).status == states.SUCCESSFUL, 60,
                 "a job after the kills", on_fail=stack.logs)
        assert agent.alive()
    finally:
        proxy.close()
