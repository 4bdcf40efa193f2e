"""A private, throw-away PostgreSQL cluster for tests that restart or kill the database server.

Never the machine's shared server: `PrivateCluster` runs Debian's initdb/pg_ctl on a temporary
data directory and a free port, listens on 127.0.0.1 only, and is stopped and deleted after.
initdb refuses to run as root, so as root every command runs as the `postgres` user."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import psycopg

from .harness import free_port


def postgres_bindir() -> Path:
    """The newest Debian PostgreSQL binaries (PG_BINDIR overrides); fails loudly if none."""
    if os.environ.get("PG_BINDIR"):
        candidates = [os.environ["PG_BINDIR"]]
    else:
        candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                            key=lambda p: int(Path(p).parent.name))[::-1]
    for path in candidates:
        if (Path(path) / "initdb").exists() and (Path(path) / "pg_ctl").exists():
            return Path(path)
    raise RuntimeError("no PostgreSQL server binaries (initdb, pg_ctl) under "
                       "/usr/lib/postgresql/*/bin: apt-get install postgresql, or set PG_BINDIR")


class PrivateCluster:
    def __init__(self):
        self.bindir = postgres_bindir()
        self.port = free_port()
        self.host = "127.0.0.1"
        self.user = "postgres"
        self.datadir = Path(tempfile.mkdtemp(prefix="jobqueue-pg-"))
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            shutil.chown(self.datadir, "postgres", "postgres")

    def _run(self, *argv: str, timeout: float = 120) -> None:
        cmd = [str(self.bindir / argv[0]), *argv[1:]]
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        # Output to a file, not a pipe: a postmaster started by pg_ctl would inherit the
        # pipe and keep it open, and reading it to its end would never return.
        with tempfile.TemporaryFile() as out:
            code = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=out,
                                  stderr=subprocess.STDOUT, timeout=timeout,
                                  cwd=self.datadir).returncode
            out.seek(0)
            said = out.read().decode(errors="replace")
        if code != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({code}):\n{said}{self.server_log()}")

    def server_log(self) -> str:
        try:
            return (self.datadir / "server.log").read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def start(self) -> PrivateCluster:
        self._run("initdb", "-D", str(self.datadir / "data"), "-U", self.user, "-A", "trust",
                  "-E", "UTF8", "--no-instructions")
        options = f"-p {self.port} -c listen_addresses={self.host} -k {self.datadir}"
        self._run("pg_ctl", "-D", str(self.datadir / "data"), "-l", self._log, "-o", options,
                  "-w", "-t", "60", "start")
        return self

    @property
    def _log(self) -> str:
        return str(self.datadir / "server.log")

    def restart_immediate(self) -> None:
        """Crash-like restart: `pg_ctl restart -m immediate`, waiting until it accepts
        connections again (it goes through crash recovery)."""
        self._run("pg_ctl", "-D", str(self.datadir / "data"), "-l", self._log, "-m",
                  "immediate", "-w", "-t", "90", "restart")

    def is_ready(self) -> bool:
        try:
            with psycopg.connect(self.url("postgres"), connect_timeout=2) as conn:
                conn.execute("SELECT 1")
        except psycopg.Error:
            return False
        return True

    def create_database(self, name: str) -> None:
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')

    def url(self, database: str) -> str:
        return f"postgres://{self.user}@{self.host}:{self.port}/{database}"

    def stop(self) -> None:
        try:
            if (self.datadir / "data" / "postmaster.pid").exists():
                self._run("pg_ctl", "-D", str(self.datadir / "data"), "-m", "immediate",
                          "-w", "stop")
        finally:
            shutil.rmtree(self.datadir, ignore_errors=True)
