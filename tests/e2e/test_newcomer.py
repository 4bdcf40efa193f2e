"""A newcomer's first run, as the README writes it: `make run` (on SQLite, and on PostgreSQL
after the README's `createdb`), the landing page, the README's five exports and its
`jobqueue-agent` line, its two `curl` commands, until the job is `successful`; a second
`make run PORT=...` beside the first; `make run` against a database that does not exist,
which must end in a short hint, not a traceback; and the README's "one layer alone" test
commands (`make install-dev`, the unit layer, the SQLite line collected).

The commands are taken from README.md itself, with only the values a reader would paste
(ids, the key, the token) and the test's own port, var directory and database name put in.
`make` is told not to reinstall the virtualenv (`-o .venv/.installed`): the suite's two
database passes run at once in that one virtualenv.
"""

import json
import os
import re
import signal
import subprocess
import uuid
from pathlib import Path

import httpx
import psycopg
import pytest
from django.db import connection

from .harness import ROOT, free_port, wait_for

pytestmark = [pytest.mark.e2e]

README = (ROOT / "README.md").read_text()
MAKE = ["make", "--no-print-directory", "-o", ".venv/.installed"]


def readme_block(after: str) -> str:
    """The first ```sh block after the sentence `after`."""
    rest = README[README.index(after):]
    start = rest.index("```sh\n") + len("```sh\n")
    return rest[start:rest.index("```", start)]


def make_env(tmp_path: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("JOBQUEUE_", "DATABASE_URL", "DJANGO_", "PROMETHEUS_",
                                "SQLITE_TEST_NAME", "MAKEFLAGS", "MFLAGS"))}
    env["JOBQUEUE_VAR_DIR"] = str(tmp_path / "var")
    env.update(extra)
    return env


class MakeRun:
    """`make run PORT=...` in a session of its own; its output in a file."""

    def __init__(self, tmp_path: Path, port: int, env: dict):
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log = tmp_path / f"make-run-{port}.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([*MAKE, "run", f"PORT={port}"], cwd=ROOT, env=env,
                                         stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_serving(self):
        def answers():
            assert self.proc.poll() is None, self.output()
            try:
                return httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(answers, 300, "make run to serve", on_fail=self.output)
        return self

    def credentials(self) -> dict:
        found = dict(re.findall(r"^  (workspace_id|api_key|job_agent_id|token) +(\S+)$",
                                self.output(), re.M))
        assert len(found) == 4, self.output()
        return found

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)  # Ctrl-C, as the README says
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@pytest.fixture
def database(tmp_path):
    """The DATABASE_URL a newcomer would use: none on SQLite; on PostgreSQL a database made
    with the README's createdb line (dropped afterwards)."""
    if connection.vendor != "postgresql":
        yield None
        return
    d = connection.settings_dict
    host, port, user = d.get("HOST") or "127.0.0.1", str(d.get("PORT") or 5432), \
        d.get("USER") or "postgres"
    name = f"jq_newcomer_{uuid.uuid4().hex[:10]}"
    block = readme_block("On PostgreSQL, create the database first")
    createdb, run_line = block.strip().splitlines()
    assert createdb == "createdb -h 127.0.0.1 -U postgres jobqueue"
    createdb = createdb.replace("127.0.0.1", f"{host} -p {port}").replace(
        "postgres", user).rsplit(" ", 1)[0] + f" {name}"
    env = {**os.environ, "PGPASSWORD": d.get("PASSWORD") or ""}
    subprocess.run(createdb, shell=True, check=True, env=env, timeout=60)
    auth = user + (f":{d['PASSWORD']}" if d.get("PASSWORD") else "")
    url = f"postgres://{auth}@{host}:{port}/{name}"
    assert run_line.startswith("DATABASE_URL=postgres://postgres@127.0.0.1:5432/jobqueue make run")
    try:
        yield url
    finally:
        with psycopg.connect(f"postgresql://{auth}@{host}:{port}/postgres",
                             autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_the_readme_quickstart_runs_as_written(tmp_path, database):
    extra = {"DATABASE_URL": database} if database else {}
    first = MakeRun(tmp_path, free_port(), make_env(tmp_path, **extra))
    agent = None
    second = None
    try:
        first.wait_serving()
        creds = first.credentials()
        # The landing page links the docs, the schema and the admin.
        landing = httpx.get(first.url + "/").text
        assert all(f'href="{p}"' in landing for p in ("/v1/docs/", "/v1/schema/", "/admin/"))

        # Second terminal: the five exports with the printed values, then the agent.
        exports = readme_block("In a second terminal").replace(
            "http://127.0.0.1:8000", first.url)
        for name, value in creds.items():
            exports = exports.replace(f"<{name}>", value)
        assert "<" not in exports, exports
        agent_log = tmp_path / "agent.log"
        with open(agent_log, "wb") as out:
            agent = subprocess.Popen(["sh", "-c", exports], cwd=ROOT, env=make_env(tmp_path),
                                     stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        export_lines = "\n".join(line for line in exports.splitlines()
                                 if line.startswith("export "))

        # Third terminal: the same exports, the README's curl commands.
        create, get = readme_block("In a third terminal").split("\nJSON\n")
        answer = subprocess.run(["sh", "-c", f"{export_lines}\n{create}\nJSON\n"], cwd=ROOT,
                                env=make_env(tmp_path), capture_output=True, text=True,
                                timeout=60, check=True)
        job = json.loads(answer.stdout)
        get = get.replace("<id from the answer>", job["id"])

        def done():
            assert agent.poll() is None, agent_log.read_text()
            out = subprocess.run(["sh", "-c", f"{export_lines}\n{get}"], cwd=ROOT,
                                 env=make_env(tmp_path), capture_output=True, text=True,
                                 timeout=60, check=True).stdout
            return json.loads(out)["status"] == "successful" and json.loads(out)

        wait_for(done, 120, "the README's job to end",
                 on_fail=lambda: agent_log.read_text() + first.output())
        assert done()["result"] == {"shout": "HELLO"}  # what the README's comment says
        assert "never logged" not in agent_log.read_text() + first.output()

        # A second server from the same checkout, on another port: the same demo
        # credentials (the agent keeps working), metrics and control socket of its own.
        second = MakeRun(tmp_path, free_port(), make_env(tmp_path, **extra)).wait_serving()
        assert second.credentials() == creds
        assert "the same as the last run" in second.output()
        var = tmp_path / "var"
        for server in (first, second):
            assert (var / f"prometheus-{server.port}").is_dir()
            assert (var / f"gunicorn-{server.port}.ctl").exists()
            assert httpx.get(server.url + "/metrics").status_code == 200
        # The first server's counters survived the second's start.
        metrics = httpx.get(first.url + "/metrics").text
        assert re.search(r'^jobqueue_claims_total\{job_agent_id="[^"]+"\} [1-9]', metrics, re.M)
        assert agent.poll() is None, agent_log.read_text()
    finally:
        if agent is not None and agent.poll() is None:
            os.killpg(agent.pid, signal.SIGINT)
            agent.wait(timeout=60)
        for server in (second, first):
            if server is not None:
                server.stop()


@pytest.mark.postgres_only
def test_make_run_without_its_database_says_how_to_create_it(tmp_path):
    d = connection.settings_dict
    host, port, user = d.get("HOST") or "127.0.0.1", d.get("PORT") or 5432, \
        d.get("USER") or "postgres"
    auth = user + (f":{d['PASSWORD']}" if d.get("PASSWORD") else "")
    name = f"jq_missing_{uuid.uuid4().hex[:10]}"
    out = subprocess.run([*MAKE, "run", f"PORT={free_port()}"], cwd=ROOT, timeout=300,
                         env=make_env(tmp_path,
                                      DATABASE_URL=f"postgres://{auth}@{host}:{port}/{name}"),
                         capture_output=True, text=True)
    said = out.stdout + out.stderr
    assert out.returncode != 0
    assert f'The database "{name}" does not exist' in said
    assert f"createdb -h {host} -p {port} -U {user} {name}" in said
    assert "Traceback" not in said and len(said.strip().splitlines()) <= 6, said
    if d.get("PASSWORD"):
        assert d["PASSWORD"] not in said


@pytest.mark.skipif(connection.vendor != "sqlite",
                    reason="uses no database: run once, in the SQLite pass")
def test_the_readmes_one_layer_test_commands_run_as_written(tmp_path):
    """The README's "one layer alone" block, line by line: `make install-dev`, the unit
    layer as written (it must pass), and the SQLite line, collected only (running it would
    run this very pass again)."""
    install, unit, sqlite = [line.split("#")[0].strip() for line in readme_block(
        "One layer alone").strip().splitlines()]
    assert (install, unit) == ("make install-dev", ".venv/bin/pytest tests/unit")
    assert sqlite == "env -u DATABASE_URL .venv/bin/pytest tests/integration"
    env = make_env(tmp_path)
    make = subprocess.run([*MAKE[:-2], "-o", ".venv/.installed-dev", *install.split()[1:]],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert make.returncode == 0, make.stdout + make.stderr
    ran = subprocess.run(["sh", "-c", unit], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=900)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert re.search(r"\b\d+ passed", ran.stdout.strip().splitlines()[-1]), ran.stdout[-500:]
    collected = subprocess.run(["sh", "-c", f"{sqlite} --collect-only -q"], cwd=ROOT, env=env,
                               capture_output=True, text=True, timeout=300)
    assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-3000:]
    assert re.search(r"^\d+(/\d+)? tests collected", collected.stdout.strip().splitlines()[-1],
                     re.M), collected.stdout[-500:]
