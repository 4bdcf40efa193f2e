"""A real HTTP receiver for webhook tests: a threading HTTP server on 127.0.0.1 that records
every request and answers as the test scripts it (status codes, hangs, redirects, big bodies)."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    def __init__(self):
        self.requests: list[dict] = []
        self.script: list = []  # per request, in order: int status, ("hang", s), ("redirect",),
        self.default = 200      # ("big", n bytes), ("wait", Event), ("drip", s, n bytes: the
        #                         whole answer a byte every s seconds); then `default`
        self.lock = threading.Lock()
        self.arrived = threading.Condition(self.lock)
        self.bytes_written = 0
        self.answered = 0  # requests whose answer has ended (written whole, or cut)
        self.hung_up = 0  # answers cut because the sender hung up
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver.lock:
                    receiver.requests.append({"path": self.path, "headers": dict(self.headers),
                                              "body": body})
                    step = receiver.script.pop(0) if receiver.script else receiver.default
                    receiver.arrived.notify_all()
                try:
                    receiver.answer(self, step)
                finally:
                    with receiver.lock:
                        receiver.answered += 1
                        receiver.arrived.notify_all()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        # A sender that hangs up (a try cut at its deadline or by a stop) is expected here.
        self.server.handle_error = lambda request, client_address: None
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, handler, step):
        if isinstance(step, int):
            handler.send_response(step)
            handler.send_header("Content-Length", "2")
            handler.end_headers()
            handler.wfile.write(b"ok")
        elif step[0] == "hang":
            time.sleep(step[1])
            self.answer(handler, 200)
        elif step[0] == "wait":
            step[1].wait(60)
            self.answer(handler, 200)
        elif step[0] == "redirect":
            handler.send_response(302)
            handler.send_header("Location", self.url + "/elsewhere")
            handler.send_header("Content-Length", "0")
            handler.end_headers()
        elif step[0] == "drip":
            answer = (f"HTTP/1.1 200 OK\r\nContent-Length: {step[2]}\r\n\r\n".encode()
                      + b"x" * step[2])
            try:
                for i in range(len(answer)):
                    handler.wfile.write(answer[i:i + 1])
                    handler.wfile.flush()
                    self.bytes_written += 1
                    time.sleep(step[1])
            except OSError:  # the sender hung up
                self.hung_up += 1
            handler.close_connection = True
        elif step[0] == "big":
            handler.send_response(200)
            handler.send_header("Content-Length", str(step[1]))
            handler.end_headers()
            chunk = b"x" * 65536
            try:
                for _ in range(step[1] // len(chunk)):
                    handler.wfile.write(chunk)
                    self.bytes_written += len(chunk)
            except OSError:  # the sender hung up
                self.hung_up += 1

    def wait_for(self, n, timeout=60):
        with self.lock:
            assert self.arrived.wait_for(lambda: len(self.requests) >= n, timeout), \
                f"{len(self.requests)} of {n} requests arrived"

    def wait_answered(self, n, timeout=60):
        """Until `n` answers have ended (the handler is done writing, or the sender hung up)."""
        with self.lock:
            assert self.arrived.wait_for(lambda: self.answered >= n, timeout), \
                f"{self.answered} of {n} answers ended"

    def close(self):
        self.server.shutdown()
        self.server.server_close()
