"""config/keepalive.py's rule: when an answer that leaves part of the request body unread
closes the connection (the real server's side: tests/integration/api/
test_request_bodies_gunicorn.py)."""

import io

import pytest

from config.keepalive import SERVER_DRAINS_BYTES, CloseAfterUnreadBody


class ServerResponse:
    """What gunicorn hands the application: a bound start_response of an object that can
    be told to close the connection."""

    def __init__(self):
        self.closed = False
        self.status = None

    def force_close(self):
        self.closed = True

    def start_response(self, status, headers, exc_info=None):
        self.status = status


def serve(environ, status, read=None):
    def app(environ, start_response):
        if read is not None:
            environ["wsgi.input"].read(*read)
        start_response(status, [])
        return [b""]

    server = ServerResponse()
    CloseAfterUnreadBody(app)(environ, server.start_response)
    assert server.status == status
    return server.closed


def environ(body: bytes, **meta):
    return {"wsgi.input": io.BytesIO(body), **meta}


big = SERVER_DRAINS_BYTES + 1


@pytest.mark.parametrize(("meta", "body", "status", "read", "closes"), [
    ({}, b"", "200 OK", None, False),  # no body
    ({"CONTENT_LENGTH": "5"}, b"12345", "200 OK", (), False),  # read to the end
    ({"CONTENT_LENGTH": "5"}, b"12345", "400 Bad Request", (5,), False),  # read, refused
    ({"CONTENT_LENGTH": "5"}, b"12345", "200 OK", None, False),  # small: the server drains
    ({"CONTENT_LENGTH": "5"}, b"12345", "409 Conflict", None, True),  # a refusal
    ({"CONTENT_LENGTH": str(big + 10)}, b"x" * (big + 10), "200 OK", (10,), True),  # much left
    ({"CONTENT_LENGTH": "9"}, b"12345", "200 OK", (9,), False),  # ended early: nothing left
    ({"HTTP_TRANSFER_ENCODING": "chunked"}, b"123", "200 OK", (2,), True),  # unknown rest
    ({"HTTP_TRANSFER_ENCODING": "chunked"}, b"123", "413 Too Large", (), False),
    ({"CONTENT_LENGTH": "5x"}, b"12345", "400 Bad Request", None, True),
])
def test_which_answers_close_the_connection(meta, body, status, read, closes):
    assert serve(environ(body, **meta), status, read) is closes


def test_another_server_and_no_input_are_left_alone():
    seen = []

    def app(environ, start_response):
        environ["wsgi.input"].readline()
        start_response("413 Too Large", [])
        return [b""]

    wrapped = CloseAfterUnreadBody(app)
    wrapped(environ(b"a\nb" * big, CONTENT_LENGTH=str(3 * big)),
            lambda status, headers, exc_info=None: seen.append(status))
    assert seen == ["413 Too Large"]
    CloseAfterUnreadBody(lambda e, s: s("200 OK", []))({}, lambda *a: seen.append(a[0]))
    assert seen[-1] == "200 OK"


def test_the_counted_input_passes_on_what_it_does_not_count():
    seen = {}

    def app(environ, start_response):
        stream = environ["wsgi.input"]
        seen["lines"] = list(stream.readlines())  # not counted: handed to the real stream
        seen["closed"] = stream.closed
        start_response("200 OK", [])
        return [b""]

    server = ServerResponse()
    CloseAfterUnreadBody(app)(environ(b"a\nb\n", CONTENT_LENGTH="4"), server.start_response)
    assert seen == {"lines": [b"a\n", b"b\n"], "closed": False}
