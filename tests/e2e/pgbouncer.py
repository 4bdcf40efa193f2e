"""A private PgBouncer for one test: Debian's /usr/sbin/pgbouncer (scripts/ensure_pgbouncer.sh
installs it), in transaction pooling mode, on a free port on 127.0.0.1, in front of the test's
PostgreSQL server. PgBouncer refuses to run as root, so as root it runs as `postgres`. Its
files live in a temporary directory removed by stop()."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from .harness import free_port

PGBOUNCER = "/usr/sbin/pgbouncer"


class PrivateBouncer:
    def __init__(self, db_host: str, db_port: int, user: str = "postgres"):
        assert Path(PGBOUNCER).exists(), (
            "Debian's pgbouncer is missing: run scripts/ensure_pgbouncer.sh as root "
            "(make test does) or apt-get install pgbouncer"
        )
        self.db_host, self.db_port, self.user = db_host, db_port, user
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="jobqueue-pgbouncer-"))
        self._as_postgres = os.geteuid() == 0
        self.popen: subprocess.Popen | None = None
        (self.dir / "userlist.txt").write_text(f'"{user}" ""\n')
        (self.dir / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={db_host} port={db_port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            f"unix_socket_dir = {self.dir}\n"  # an online restart (-R) takes over through it
            "auth_type = trust\n"
            f"auth_file = {self.dir / 'userlist.txt'}\n"
            "pool_mode = transaction\n"
            f"admin_users = {user}\n"
            "max_client_conn = 200\n"
            "default_pool_size = 10\n"
            "ignore_startup_parameters = extra_float_digits\n"
            f"logfile = {self.dir / 'pgbouncer.log'}\n"
            "log_connections = 0\n"
            "log_disconnections = 0\n"
        )
        if self._as_postgres:
            shutil.chown(self.dir, "postgres", "postgres")
            for f in self.dir.iterdir():
                shutil.chown(f, "postgres", "postgres")

    def url(self, database: str) -> str:
        return f"postgres://{self.user}@127.0.0.1:{self.port}/{database}"

    def start(self, *options: str) -> PrivateBouncer:
        cmd = [PGBOUNCER, *options, str(self.dir / "pgbouncer.ini")]
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        self.popen = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 30
        while not self.is_ready():
            if self.popen.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("pgbouncer did not start:\n" + self.log())
            time.sleep(0.05)
        return self

    def is_ready(self) -> bool:
        try:
            with psycopg.connect(self.url("postgres"), connect_timeout=2) as conn:
                conn.execute("SELECT 1")
        except psycopg.Error:
            return False
        return True

    def show(self, what: str) -> list[tuple]:
        """SHOW <what> on PgBouncer's admin console (`pgbouncer` database)."""
        with psycopg.connect(self.url("pgbouncer"), autocommit=True,
                             prepare_threshold=None) as conn:
            cur = conn.cursor()
            cur.execute(f"SHOW {what}")
            return cur.fetchall()

    def stop(self, sig: int = signal.SIGINT) -> None:
        """SIGINT: PgBouncer's safe shutdown (waits for transactions in flight, then exits,
        closing every client connection); SIGTERM: at once."""
        if self.popen is not None and self.popen.poll() is None:
            os.killpg(self.popen.pid, sig)
            try:
                self.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait()

    def restart(self) -> float:
        """Stop (safe shutdown) and start again on the same port: the seconds it was down."""
        t0 = time.monotonic()
        self.stop()
        self.start()
        return time.monotonic() - t0

    def restart_online(self) -> float:
        """PgBouncer's online restart (`pgbouncer -R`): a new process takes the listening
        sockets and every client and server connection over from the running one, which then
        exits; nothing is closed. The seconds until the old one has gone."""
        t0 = time.monotonic()
        old = self.popen
        self.start("-R")
        assert old is not None
        old.wait(timeout=30)  # the new process shut it down once it held its sockets
        return time.monotonic() - t0

    def log(self) -> str:
        try:
            return (self.dir / "pgbouncer.log").read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def close(self) -> None:
        try:
            self.stop(signal.SIGTERM)
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
