"""Request bodies read as the client sent them: a body cut short (it ends before its
Content-Length or its last chunk, the connection broke, a chunk is malformed) is a 400
`incomplete_body`, never taken for the whole. The raw-body endpoints (agents/views/outputs.py)
read through ClientBody; the size cap (agents/middleware.py) reads chunked bodies with
BODY_READ_ERRORS caught."""

from __future__ import annotations

from rest_framework import status
from rest_framework.exceptions import APIException

try:  # what gunicorn raises for a malformed or cut chunked body (its NoMoreData is OSError)
    from gunicorn.http.errors import ParseException as _ServerParseError
except ImportError:  # pragma: no cover - gunicorn is a dependency
    _ServerParseError = OSError

# What reading a request body raises when the client's bytes stop or make no sense.
BODY_READ_ERRORS = (OSError, _ServerParseError)


class ClientBody:
    """The request body as the client sent it. A body that ends before its declared length
    (the client stopped sending and closed its side), a cut connection or a malformed chunk
    is an IncompleteBody (400), so that nothing takes a part of a body for the whole."""

    def __init__(self, stream, declared):
        self.stream = stream
        self.left = None if declared is None else int(declared)

    def read(self, n=-1):
        try:
            data = self.stream.read(n)
        except BODY_READ_ERRORS as exc:
            raise IncompleteBody() from exc
        if self.left is not None:
            self.left -= len(data)
            if self.left > 0 and (not data or n is None or n < 0):
                raise IncompleteBody()
        return data


class IncompleteBody(APIException):
    status_code = status.HTTP_400_BAD_REQUEST
    default_detail = ("The request body ended before its end (Content-Length, or the "
                      "chunked body's last chunk): send the whole body.")
    default_code = "incomplete_body"
