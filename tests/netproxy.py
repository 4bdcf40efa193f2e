"""A small TCP proxy that a test can cut and restore, to stage a network or database
outage between a real process and a real server without touching the server itself."""

import socket
import threading


class TcpProxy:
    def __init__(self, target_host: str, target_port: int, listen_port: int = 0):
        self.target = (target_host, target_port)
        self.listen_port = listen_port
        self._server = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._running = False

    @property
    def port(self) -> int:
        return self.listen_port

    def start(self) -> "TcpProxy":
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("127.0.0.1", self.listen_port))
        srv.listen(64)
        self.listen_port = srv.getsockname()[1]
        self._server = srv
        self._running = True
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def stop(self) -> None:
        """Refuse new connections and cut every open one (an outage)."""
        self._running = False
        if self._server is not None:
            try:
                self._server.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._server.close()
            self._server = None
        with self._lock:
            for conn in self._conns:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                conn.close()
            self._conns.clear()

    def _accept(self):
        srv = self._server
        while self._running:
            try:
                client, _ = srv.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            for a, b, from_server in ((client, upstream, False), (upstream, client, True)):
                threading.Thread(target=self._pipe, args=(a, b, from_server),
                                 daemon=True).start()

    def forwards(self, from_server: bool) -> bool:
        """Whether the chunk just read goes on; False drops it and cuts the connection (a
        subclass loses answers so: tests/integration/api/test_lost_answers.py)."""
        return True

    def _pipe(self, src, dst, from_server):
        try:
            while True:
                data = src.recv(65536)
                if not data or not self.forwards(from_server):
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
