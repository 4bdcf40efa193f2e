"""Packaging: the agent installs alone (httpx, no Django), and the pins in requirements.txt are
the dependencies the two pyproject.toml files declare."""

import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "clients" / "python"
SERVER_ONLY = {"django", "djangorestframework", "psycopg", "django-environ", "drf-spectacular",
               "gunicorn", "whitenoise", "prometheus-client", "jobqueue"}


def declared(pyproject: Path) -> dict[str, Requirement]:
    project = tomllib.loads(pyproject.read_text())["project"]
    reqs = [Requirement(r) for r in project.get("dependencies", [])]
    return {canonicalize_name(r.name): r for r in reqs}


def pinned() -> dict[str, Requirement]:
    reqs = [Requirement(line.split("#")[0].strip())
            for line in (ROOT / "requirements.txt").read_text().splitlines()
            if line.split("#")[0].strip()]
    return {canonicalize_name(r.name): r for r in reqs}


def test_requirements_pin_exactly_what_the_pyprojects_declare():
    server, client, pins = declared(ROOT / "pyproject.toml"), declared(CLIENT / "pyproject.toml"), \
        pinned()
    assert set(client) == {"httpx"}  # the agent needs httpx and nothing else
    # The server needs httpx too (the webhook sender), in the same range; nothing else shared.
    assert set(server) & set(client) == {"httpx"}
    assert server["httpx"].specifier == client["httpx"].specifier
    assert set(pins) == set(server) | set(client)
    for name, pin in pins.items():
        [spec] = pin.specifier
        assert spec.operator == "==", f"{name}: requirements.txt pins one release"
        wanted = server.get(name) or client[name]
        assert wanted.specifier.contains(spec.version), f"{pin} is outside {wanted}"
        assert pin.extras == wanted.extras, name


def test_the_clients_fencing_extra_is_what_the_server_signs_with():
    """Verifying fencing tokens is optional for the agent (`jobqueue-client[fencing]`); the
    extra declares the server's own ranges of the JOSE library and its crypto backend."""
    project = tomllib.loads((CLIENT / "pyproject.toml").read_text())["project"]
    extra = {canonicalize_name(r.name): r
             for r in map(Requirement, project["optional-dependencies"]["fencing"])}
    server = declared(ROOT / "pyproject.toml")
    assert set(extra) == {"pyjwt", "cryptography"}
    for name, req in extra.items():
        assert req.specifier == server[name].specifier, name
        [pin] = pinned()[name].specifier
        assert req.specifier.contains(pin.version), f"the {name} pin is outside the extra"


def test_both_distributions_admit_python_3_11_and_3_12():
    for pyproject in (ROOT / "pyproject.toml", CLIENT / "pyproject.toml"):
        project = tomllib.loads(pyproject.read_text())["project"]
        spec = Requirement(f"python{project['requires-python']}").specifier
        assert spec.contains("3.11.7") and spec.contains("3.12.1"), pyproject
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"].get("scripts", {})
    # The client distribution owns the console scripts.
    assert not {"jobqueue-agent", "jobqueue"} & set(scripts)


@pytest.fixture(scope="module")
def agent_venv(tmp_path_factory):
    """A fresh virtualenv (no pip of its own, no system site-packages) with only
    `pip install ./clients/python` in it, done by this interpreter's pip."""
    venv = tmp_path_factory.mktemp("agent-venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    out = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
         "--disable-pip-version-check", str(CLIENT)],
        env=clean_env(), cwd=venv, capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return venv


def clean_env() -> dict:
    """This process's environment without what would let the venv see our code."""
    return {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "DJANGO_SETTINGS_MODULE", "VIRTUAL_ENV")
            and not k.startswith("JOBQUEUE_")}


def run_in(venv: Path, *argv: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv / "bin" / argv[0]), *argv[1:]], env=clean_env(), cwd=venv,
                          capture_output=True, text=True, timeout=60, **kw)


def test_the_agent_installs_alone_with_httpx_and_no_django(agent_venv):
    listed = run_in(agent_venv, "python", "-c",
                    "import importlib.metadata as m; "
                    "print('\\n'.join(sorted(d.metadata['Name'].lower() "
                    "for d in m.distributions())))")
    installed = set(listed.stdout.split())
    assert {"jobqueue-client", "httpx"} <= installed
    assert not installed & SERVER_ONLY, installed

    help_ = run_in(agent_venv, "jobqueue-agent", "--help")
    assert help_.returncode == 0, help_.stderr
    assert help_.stdout.startswith("usage: jobqueue-agent")
    assert "--server" in help_.stdout and "JOBQUEUE_TOKEN" in help_.stdout

    imports = run_in(agent_venv, "python", "-c",
                     "import sys, jobqueue_client.cli, jobqueue_client.client, "
                     "jobqueue_client.errors, jobqueue_client.transport, "
                     "jobqueue_client.producer, jobqueue_client.runner, "
                     "jobqueue_client.child, jobqueue_client.jobspec, "
                     "jobqueue_client.logstream, jobqueue_client.lease, "
                     "jobqueue_client.reports, jobqueue_client.artifacts, "
                     "jobqueue_client.agentlog, jobqueue_client.backoff, "
                     "jobqueue_client.producer_cli, jobqueue_client.producer_commands, "
                     "jobqueue_client.cli_output; "
                     "print(sorted({m.split('.')[0] for m in sys.modules} & "
                     "{'django', 'jobqueue', 'agents', 'rest_framework', 'config'}))")
    assert imports.returncode == 0, imports.stderr
    assert imports.stdout.strip() == "[]"
    no_django = run_in(agent_venv, "python", "-c", "import django")
    assert no_django.returncode == 1 and "ModuleNotFoundError" in no_django.stderr

    version = run_in(agent_venv, "jobqueue-agent", "--version")
    assert version.returncode == 0 and re.fullmatch(r"jobqueue-agent \d+\.\d+\.\d+\S*\n",
                                                    version.stdout), version.stdout
    meta = run_in(agent_venv, "python", "-c",
                  "import importlib.metadata as m, jobqueue_client as c; "
                  "d = m.metadata('jobqueue-client'); "
                  "print(d['Version'] == c.__version__, d['License-Expression'])")
    assert meta.stdout.split() == ["True", "Apache-2.0"], meta.stdout + meta.stderr

    missing = run_in(agent_venv, "jobqueue-agent")
    assert missing.returncode == 2 and "missing --server (JOBQUEUE_SERVER)" in missing.stderr


def test_the_producer_command_line_is_installed_with_it(agent_venv):
    """`pip install ./clients/python` puts the `jobqueue` command beside jobqueue-agent."""
    help_ = run_in(agent_venv, "jobqueue", "--help")
    assert help_.returncode == 0, help_.stderr
    assert help_.stdout.startswith("usage: jobqueue ")
    assert "JOBQUEUE_URL" in help_.stdout and "exit status:" in help_.stdout
    create = run_in(agent_venv, "jobqueue", "jobs", "create", "--help")
    assert create.returncode == 0 and "--wait" in create.stdout
    installed = run_in(agent_venv, "python", "-c",
                       "import importlib.metadata as m; print(m.version('jobqueue-client'))")
    version = run_in(agent_venv, "jobqueue", "--version")
    assert version.returncode == 0 and version.stdout == f"jobqueue {installed.stdout}"
    missing = run_in(agent_venv, "jobqueue", "jobs", "list")
    assert missing.returncode == 2 and "set JOBQUEUE_URL (or --url)" in missing.stderr


def test_the_effect_command_is_installed_with_it(agent_venv):
    """`jobqueue-effect` (a job's child's way to the effect ledger) comes with the agent;
    outside a job (no JOB_EFFECT_SOCKET) it says so with exit status 5 (no answer)."""
    help_ = run_in(agent_venv, "jobqueue-effect", "--help")
    assert help_.returncode == 0, help_.stderr
    assert help_.stdout.startswith("usage: jobqueue-effect") and "begin" in help_.stdout
    outside = run_in(agent_venv, "jobqueue-effect", "begin", "charge-card")
    assert outside.returncode == 5 and "JOB_EFFECT_SOCKET is not set" in outside.stderr
    bad = run_in(agent_venv, "jobqueue-effect", "commit", "charge-card", "--result", "{x")
    assert bad.returncode == 2 and "not valid JSON" in bad.stderr


def test_the_installed_agent_runs_and_stops_cleanly_on_sigterm(agent_venv):
    """Against a port where nothing listens: it retries its claims, and SIGTERM ends it with
    status 0, as under a supervisor."""
    env = clean_env() | {"JOBQUEUE_SERVER": "http://127.0.0.1:9", "JOBQUEUE_WORKSPACE": "w",
                         "JOBQUEUE_AGENT": "a", "JOBQUEUE_TOKEN": "jqa_x_y",
                         "JOBQUEUE_IDLE_MAX": "0.2"}
    proc = subprocess.Popen([str(agent_venv / "bin" / "jobqueue-agent")], env=env,
                            cwd=agent_venv, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            lines.append(line)
            if "event=claim_retry" in line or not line:
                break
        # The address it tried is in the line (no credential is part of it).
        assert any(re.search(r"event=claim_retry code=network_error url=http://127\.0\.0\.1:9/v1/"
                             r"workspaces/w/job-agents/a/jobs/claim", x) for x in lines), lines
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    assert "event=signal name=SIGTERM action=drain" in rest
    assert "event=stopped exit_code=0" in rest
    assert "jqa_x_y" not in "".join(lines) + rest


def test_the_server_distribution_ships_every_app_and_coverage_measures_it():
    """Each top-level package of the server (an app or config) is in the wheel
    (setuptools' include) and in coverage's source; tests and benchmarks are in neither."""
    from fnmatch import fnmatch

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    measured = set(config["tool"]["coverage"]["run"]["source_pkgs"])
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests", "benchmarks"}
    assert packages >= {"config", "jobqueue", "agents"}
    for name in packages:
        assert any(fnmatch(name, pattern) for pattern in include), f"{name} is not shipped"
    assert measured == packages | {"jobqueue_client"}
    assert not any(fnmatch(n, p) for n in ("tests", "benchmarks") for p in include)
