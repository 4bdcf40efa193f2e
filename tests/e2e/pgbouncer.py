"""A private PgBouncer for one test: Debian's /usr/sbin/pgbouncer (scripts/ensure_pgbouncer.sh
installs it) with the documented configuration (docs/deploy/pgbouncer.ini: transaction
pooling, SCRAM logins), on a free port on 127.0.0.1, in front of the test's PostgreSQL
server. PgBouncer refuses to run as root, so as root it runs as `postgres`. Its files live in
a temporary directory removed by close()."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from tests.deploy_files import deploy_file

from .harness import free_port, tail_of

PGBOUNCER = "/usr/sbin/pgbouncer"


class PrivateBouncer:
    def __init__(self, db_host: str, db_port: int, database: str, user: str = "postgres"):
        assert Path(PGBOUNCER).exists(), (
            "Debian's pgbouncer is missing: run scripts/ensure_pgbouncer.sh as root "
            "(make test does) or apt-get install pgbouncer"
        )
        self.db_host, self.db_port, self.database, self.user = db_host, db_port, database, user
        # Clients log in to PgBouncer with a password (auth_type = scram-sha-256, as
        # documented); PgBouncer then logs in to the test's PostgreSQL as the same role.
        self.password = "bouncer-" + secrets.token_hex(8)
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="jobqueue-pgbouncer-"))
        self._as_postgres = os.geteuid() == 0
        self.popen: subprocess.Popen | None = None
        (self.dir / "userlist.txt").write_text(f'"{user}" "{self.password}"\n')
        # The documented pgbouncer.ini as it is, but where this PgBouncer listens, the test
        # database it serves and where its files live; then what a test needs on top (the
        # admin console for SHOW, a log file to show when it does not start).
        ini = deploy_file("pgbouncer.ini", {
            "jobqueue = host=127.0.0.1 port=5432": f"{database} = host={db_host} port={db_port}",
            "listen_port = 6432": f"listen_port = {self.port}",
            "unix_socket_dir = /run/postgresql": f"unix_socket_dir = {self.dir}",
            "auth_file = /etc/pgbouncer/userlist.txt": f"auth_file = {self.dir / 'userlist.txt'}",
        })
        assert ini.rstrip().splitlines()[-1].startswith("ignore_startup_parameters"), (
            "the test appends to the [pgbouncer] section: keep it last in pgbouncer.ini")
        (self.dir / "pgbouncer.ini").write_text(
            ini
            + f"admin_users = {user}\n"
            f"logfile = {self.dir / 'pgbouncer.log'}\n"
            "log_connections = 0\n"
            "log_disconnections = 0\n"
        )
        if self._as_postgres:
            shutil.chown(self.dir, "postgres", "postgres")
            for f in self.dir.iterdir():
                shutil.chown(f, "postgres", "postgres")

    def url(self, database: str | None = None) -> str:
        """The served test database (by default), or `pgbouncer` (the admin console)."""
        return (f"postgres://{self.user}:{self.password}@127.0.0.1:{self.port}/"
                f"{database or self.database}")

    def start(self, *options: str) -> PrivateBouncer:
        cmd = [PGBOUNCER, *options, str(self.dir / "pgbouncer.ini")]
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        # What it says before its log file is open (a configuration it cannot load) goes to
        # stderr: kept beside the log.
        with open(self.dir / "pgbouncer.stderr", "ab") as err:
            self.popen = subprocess.Popen(cmd, stdin=subprocess.DEVNULL,
                                          stdout=subprocess.DEVNULL, stderr=err,
                                          start_new_session=True)
        deadline = time.monotonic() + 30
        while not self.is_ready():
            if self.popen.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("pgbouncer did not start:\n" + self.log())
            time.sleep(0.05)
        return self

    def is_ready(self) -> bool:
        try:
            with psycopg.connect(self.url(), connect_timeout=2) as conn:
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
        return tail_of(self.dir / "pgbouncer.stderr", self.dir / "pgbouncer.log")

    def close(self) -> None:
        try:
            self.stop(signal.SIGTERM)
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
