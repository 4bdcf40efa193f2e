"""The servers the scenarios run against, besides the project's database: pgbench (the
machine's limit, timed between the drains) and gunicorn serving the project.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import tempfile
import time

from benchmarks.common import ROOT, db_name, db_url, recreate_database
from benchmarks.project import DB


def pgbench_tps(clients, seconds):
    script = tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False)
    script.write("\\set aid random(1, 100000)\n"
                 "UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = :aid;\n")
    script.close()
    out = subprocess.run(
        ["pgbench", "-n", *pg_cli_args(), "-c", str(clients), "-j", str(min(clients, 2)),
         "-T", str(seconds), "-f", script.name, db_name("pgbench")],
        capture_output=True, text=True, check=True,
    ).stdout
    os.unlink(script.name)
    m = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out)
    return float(m.group(1))


def pg_cli_args():
    """-h/-p/-U for PostgreSQL's command-line tools, from BENCH_DATABASE_URL."""
    from urllib.parse import urlparse

    url = urlparse(db_url("postgres"))
    return ["-h", url.hostname or "127.0.0.1", "-p", str(url.port or 5432),
            "-U", url.username or "postgres"]


def setup_pgbench():
    recreate_database(db_name("pgbench"))
    subprocess.run(["pgbench", "-i", "-q", "-s", "1", *pg_cli_args(), db_name("pgbench")],
                   check=True, capture_output=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_gunicorn(workers, threads=None, env_extra=None):
    port = free_port()
    env = {**os.environ, **(env_extra or {}), "DATABASE_URL": db_url(DB),
           "DJANGO_SETTINGS_MODULE": "benchmarks.bench_settings", "PYTHONPATH": str(ROOT),
           "LOG_LEVEL": "WARNING"}
    (ROOT / "var").mkdir(exist_ok=True)
    errlog = open(ROOT / "var" / "bench-gunicorn.log", "w")  # noqa: SIM115 - lives with proc
    proc = subprocess.Popen(
        [str(ROOT / ".venv" / "bin" / "gunicorn"), "-c",
         str(ROOT / "config" / "gunicorn.conf.py"), "--bind", f"127.0.0.1:{port}",
         "--workers", str(workers), "--log-level", "warning",
         *(["--threads", str(threads)] if threads else []),
         *os.environ.get("BENCH_GUNICORN_ARGS", "").split()],  # e.g. "--worker-class sync"
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=errlog, text=True,
    )
    import logging

    import httpx

    logging.getLogger("httpx").setLevel(logging.WARNING)
    for _ in range(200):
        try:
            httpx.get(f"http://127.0.0.1:{port}/v1/schema/", timeout=2)
            return proc, port
        except httpx.HTTPError:
            if proc.poll() is not None:
                raise RuntimeError("gunicorn exited: see var/bench-gunicorn.log") from None
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("gunicorn did not start")
