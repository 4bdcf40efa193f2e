"""The deployment files of docs/deploy/ (installed by docs/deploying.md, which shows each one
verbatim): the docs show them as they are, nginx's limits and timeouts fit the service's
settings, and systemd accepts the units (`systemd-analyze verify`). nginx and PgBouncer load
their files in the e2e suite (tests/e2e/test_nginx.py, tests/e2e/test_pgbouncer.py)."""

import os
import re
import runpy
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from tests.deploy_files import DEPLOY, deploy_file

ROOT = DEPLOY.parents[1]
DOC = ROOT / "docs" / "deploying.md"
UNITS = ["jobqueue-api.service", "jobqueue-maintenance.service", "jobqueue-agent.service"]
VENV_BIN = Path(sys.executable).parent


def directives(conf: str, name: str) -> list[str]:
    return re.findall(rf"^[ \t]*{name}[ \t]+([^;\n]+);", conf, flags=re.MULTILINE)


def seconds(value: str) -> int:
    number, unit = re.fullmatch(r"(\d+)(s|m)?", value).groups()
    return int(number) * (60 if unit == "m" else 1)


def code_blocks(page: Path) -> list[str]:
    return re.findall(r"^```[a-z]*\n(.*?)^```$", page.read_text(), flags=re.MULTILINE | re.DOTALL)


def test_the_page_shows_every_deploy_file_as_it_is():
    blocks = code_blocks(DOC)
    files = sorted(p.name for p in DEPLOY.iterdir())
    assert [name for name in files if (DEPLOY / name).read_text() in blocks] == files


@pytest.mark.parametrize("page", [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))],
                         ids=lambda p: p.name)
def test_a_block_that_names_a_deploy_file_is_that_file(page):
    """Every block whose head names one of the files (`(docs/deploy/<name>`), on any page."""
    for block in code_blocks(page):
        named = re.search(r"\(docs/deploy/([\w.-]+)[;)]", "".join(block.split("\n")[:2]))
        if named:
            assert block == (DEPLOY / named[1]).read_text(), named[1]


def test_nginx_fits_the_service_settings():
    conf = deploy_file("nginx.conf")
    jq = settings.JOBQUEUE
    # The largest body nginx lets through is the largest artifact file the service takes.
    [size] = directives(conf, "client_max_body_size")
    assert int(size.rstrip("m")) * 1024 * 1024 == jq["MAX_ARTIFACT_BYTES"]
    assert f"larger than {jq['MAX_ARTIFACT_BYTES']} bytes" in conf  # its 413's detail
    # A long poll is answered before nginx stops waiting for gunicorn.
    [read] = directives(conf, "proxy_read_timeout")
    assert seconds(read) > jq["MAX_CLAIM_WAIT_SECONDS"] + 10
    # The request is read whole before gunicorn sees it; headers have a deadline.
    assert directives(conf, "proxy_request_buffering") == ["on"]
    assert seconds(directives(conf, "client_header_timeout")[0]) <= 30
    # nginx passes to the address the API unit binds; gunicorn keeps an idle upstream
    # connection longer than nginx (60 s), so nginx never reuses one gunicorn is closing.
    api = deploy_file("jobqueue-api.service")
    [upstream] = directives(conf, "server")
    assert f"--bind {upstream}" in api
    gunicorn = runpy.run_path(str(ROOT / "config" / "gunicorn.conf.py"))
    assert gunicorn["bind"] == upstream
    assert "keepalive_timeout" not in conf.split("upstream jobqueue {")[1].split("}")[0]
    assert gunicorn["keepalive"] > 60


def test_the_documented_settings_pass_djangos_deployment_checks(tmp_path):
    """`manage.py check --deploy` with /etc/jobqueue/env as the install steps make it (a new
    secret key put in; a throw-away database and directory here) warns only of the choices
    docs/deploying.md explains: no SECURE_SSL_REDIRECT (W008: nginx redirects http to https
    before Django), HSTS for this host only, not its domain's others (W005) nor the browsers'
    preload list (W021)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DJANGO_", "JOBQUEUE_", "DATABASE_URL"))}
    for line in deploy_file("env").splitlines():
        if line and not line.startswith("#"):
            key, value = line.split("=", 1)
            env[key] = value
    assert env["DJANGO_SECRET_KEY"] == "CHANGE-ME"  # step 5 replaces it with this:
    env["DJANGO_SECRET_KEY"] = secrets.token_urlsafe(50)
    env.update(DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}", JOBQUEUE_VAR_DIR=str(tmp_path),
               DJANGO_SETTINGS_MODULE="config.settings")
    out = subprocess.run([sys.executable, "manage.py", "check", "--deploy"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    warned = re.findall(r"\((\w+\.\w\d+)\)", out.stdout + out.stderr)
    assert warned == ["security.W005", "security.W008", "security.W021"], out.stdout + out.stderr


def test_systemd_accepts_the_units(tmp_path):
    """`systemd-analyze verify` on each unit, with /opt/jobqueue (and the agent's virtualenv)
    pointing at this checkout and its virtualenv, so that every program a unit starts exists.
    Any warning (an unknown key, a bad value) fails the test as an error does."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.fail("systemd-analyze is missing: scripts/ensure_systemd_analyze.sh installs it "
                    "(make test runs it, as root)")
    for unit in UNITS:
        text = deploy_file(unit, {
            "ExecStart=/opt/jobqueue/.venv/bin/": f"ExecStart={VENV_BIN}/",
            "WorkingDirectory=/opt/jobqueue\n": f"WorkingDirectory={ROOT}\n",
        } if unit != "jobqueue-agent.service" else {
            "ExecStart=/opt/jobqueue-agent/bin/": f"ExecStart={VENV_BIN}/",
        })
        (tmp_path / unit).write_text(text)
        out = subprocess.run([analyze, "verify", str(tmp_path / unit)], capture_output=True,
                             text=True, timeout=60)
        assert (out.returncode, out.stdout + out.stderr) == (0, ""), unit


def test_the_agent_unit_lets_running_jobs_finish_or_be_released():
    """systemd SIGTERMs the agent alone (KillMode=mixed: control-group would SIGTERM every
    job's child at once, and each would end `failure`), and waits for its whole shutdown:
    the drain, the kill grace and the releases (the agent's defaults)."""
    from jobqueue_client.runner import AgentOptions

    service = dict(line.split("=", 1) for line in deploy_file("jobqueue-agent.service", {})
                   .splitlines() if "=" in line and not line.startswith("#"))
    assert service["KillMode"] == "mixed" and service["KillSignal"] == "SIGTERM"
    defaults = AgentOptions()
    assert int(service["TimeoutStopSec"]) > (
        defaults.drain_timeout + defaults.kill_grace + defaults.release_timeout)
