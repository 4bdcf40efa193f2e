"""Keep-alive only where the server can keep it: an answer that leaves much of the request
body unread closes the connection, and says so (`Connection: close`).

A refusal answered before the body is read (a 413 for a declared length over a cap, a 409 for
a stale claim's upload, a 401) leaves the rest of the body on the connection. gunicorn then
discards at most 64 KiB of it before it reuses the connection for the next request, and past
that closes it silently, although the answer said `Connection: keep-alive`: the client's next
request on it fails. So `CloseAfterUnreadBody` counts what the application reads of the body
and, when an answer starts while some of it is unread, closes the connection after it when
the answer is an error (status 400 and up) or what is left is more than gunicorn discards or
unknown (a chunked body). A body read to its end, and an error answered after reading it,
keep the connection.

gunicorn takes its `Connection` header from its own state, not from the application's
headers (hop-by-hop headers are dropped), so the close is asked of gunicorn's response object
(`force_close()`, the object whose `start_response` the application is handed); it then
answers `Connection: close` and closes gracefully. Under another server nothing changes
(Django's runserver reads every unread body to its end itself).
"""

from __future__ import annotations

SERVER_DRAINS_BYTES = 64 * 1024  # gunicorn's _DRAIN_MAX_BYTES


class _CountedInput:
    """The server's `wsgi.input`, counting what is read of the body and noticing its end."""

    def __init__(self, stream, length: int | None):
        self._stream = stream
        self.left = length  # None: unknown (a chunked body)
        self.ended = length == 0

    def _saw(self, data: bytes, size) -> bytes:
        if self.left is not None:
            self.left -= len(data)
            self.ended = self.ended or self.left <= 0
        if not data and size != 0:
            self.ended = True  # the end of the body (or of the connection)
        return data

    def read(self, size=-1):
        data = self._saw(self._stream.read(*(() if size == -1 else (size,))), size)
        if size is None or size < 0:
            self.ended = True  # all of it
        return data

    def readline(self, size=-1):
        return self._saw(self._stream.readline(*(() if size == -1 else (size,))), size)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _body_length(environ) -> int | None:
    if "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower():
        return None
    raw = environ.get("CONTENT_LENGTH") or "0"
    return int(raw) if raw.isascii() and raw.isdigit() else None


def must_close(status: str, body: _CountedInput) -> bool:
    """Whether the connection must close after an answer with `status` (see the module)."""
    if body.ended:
        return False
    if body.left is None or body.left > SERVER_DRAINS_BYTES:
        return True
    return int(status.split(" ", 1)[0]) >= 400


class CloseAfterUnreadBody:
    """WSGI middleware around the Django application (config/wsgi.py)."""

    def __init__(self, application):
        self.application = application

    def __call__(self, environ, start_response):
        stream = environ.get("wsgi.input")
        if stream is None:
            return self.application(environ, start_response)
        body = environ["wsgi.input"] = _CountedInput(stream, _body_length(environ))
        force_close = getattr(getattr(start_response, "__self__", None), "force_close", None)

        def start(status, headers, exc_info=None):
            if force_close is not None and must_close(status, body):
                force_close()
            return start_response(status, headers, exc_info)

        return self.application(environ, start)
