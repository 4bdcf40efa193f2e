"""A private nginx for one test: Debian's /usr/sbin/nginx (scripts/ensure_nginx.sh installs it)
with the documented site (docs/deploy/nginx.conf) as it is, but listening on free ports of
127.0.0.1, passing to the test's gunicorn, with a self-signed certificate for 127.0.0.1. It
runs in the foreground with its own prefix (a temporary directory: configuration, pid file,
logs, temporary files), never as the system's service. Root starts its workers as `nobody`."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
from pathlib import Path

from tests.deploy_files import deploy_file

from .harness import free_port, tail_of, wait_for

NGINX = "/usr/sbin/nginx"

# What the test's main configuration holds around the site (Debian's /etc/nginx/nginx.conf
# holds the same kind of lines around sites-enabled/).
MAIN = """\
daemon off;
worker_processes 1;
{user}pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log {dir}/access.log;
    client_body_temp_path {dir}/client_body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    include {dir}/jobqueue.conf;
}}
"""


class PrivateNginx:
    def __init__(self, upstream_port: int):
        assert Path(NGINX).exists(), (
            "Debian's nginx is missing: run scripts/ensure_nginx.sh as root "
            "(make test does) or apt-get install nginx"
        )
        self.port, self.http_port = free_port(), free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.dir = Path(tempfile.mkdtemp(prefix="jobqueue-nginx-"))
        self.cert = self.dir / "cert.pem"
        self.popen: subprocess.Popen | None = None
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
             "-keyout", str(self.dir / "key.pem"), "-out", str(self.cert)],
            check=True, capture_output=True)
        site = deploy_file("nginx.conf", {
            "server 127.0.0.1:8000;": f"server 127.0.0.1:{upstream_port};",
            "    listen 80;\n    listen [::]:80;\n": f"    listen 127.0.0.1:{self.http_port};\n",
            "    listen 443 ssl;\n    listen [::]:443 ssl;\n":
                f"    listen 127.0.0.1:{self.port} ssl;\n",
            "/etc/letsencrypt/live/jobs.example.com/fullchain.pem": str(self.cert),
            "/etc/letsencrypt/live/jobs.example.com/privkey.pem": str(self.dir / "key.pem"),
        })
        (self.dir / "jobqueue.conf").write_text(site)
        as_root = os.geteuid() == 0
        (self.dir / "nginx.conf").write_text(
            MAIN.format(dir=self.dir, user="user nobody nogroup;\n" if as_root else ""))
        if as_root:  # its workers write request bodies and answers under the prefix
            shutil.chown(self.dir, "nobody", "nogroup")

    def start(self) -> PrivateNginx:
        argv = [NGINX, "-p", str(self.dir), "-c", str(self.dir / "nginx.conf"),
                "-e", str(self.dir / "error.log")]
        checked = subprocess.run([*argv, "-t"], capture_output=True, text=True)
        assert checked.returncode == 0, checked.stderr
        self.popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, start_new_session=True)
        wait_for(self._listening, 30, "nginx to listen", interval=0.05, on_fail=self.log)
        return self

    def _listening(self) -> bool:
        if self.popen is not None and self.popen.poll() is not None:
            raise AssertionError("nginx exited:\n" + self.log())
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    def client_context(self) -> ssl.SSLContext:
        """What a client trusts to reach it: its self-signed certificate."""
        return ssl.create_default_context(cafile=str(self.cert))

    def tls_socket(self) -> ssl.SSLSocket:
        """A client connection to the HTTPS server, handshake done, nothing sent yet."""
        raw = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        return self.client_context().wrap_socket(raw, server_hostname="127.0.0.1")

    def log(self) -> str:
        return tail_of(self.dir / "error.log")

    def close(self) -> None:
        """SIGTERM: nginx's fast shutdown (closes every connection, slow clients included)."""
        try:
            if self.popen is not None and self.popen.poll() is None:
                os.killpg(self.popen.pid, signal.SIGTERM)
                try:
                    self.popen.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(self.popen.pid, signal.SIGKILL)
                    self.popen.wait()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
