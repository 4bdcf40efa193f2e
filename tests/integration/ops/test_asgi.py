"""config/asgi.py serves the same application as config/wsgi.py (gunicorn serves WSGI; an
ASGI server such as uvicorn or daphne can serve this one)."""

import json

import pytest
from asgiref.sync import async_to_sync
from asgiref.testing import ApplicationCommunicator

import jobqueue

pytestmark = pytest.mark.django_db


def asgi_get(path: str, headers=()):
    from config.asgi import application

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "GET", "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "headers": list(headers),
             "server": ("testserver", 80), "client": ("127.0.0.1", 5000)}

    async def call():
        comm = ApplicationCommunicator(application, scope)
        await comm.send_input({"type": "http.request", "body": b"", "more_body": False})
        start = await comm.receive_output(30)
        body = b""
        while True:
            message = await comm.receive_output(30)
            body += message.get("body", b"")
            if not message.get("more_body"):
                return start["status"], dict(start["headers"]), body

    return async_to_sync(call)()


def test_the_asgi_application_answers_health_and_api_errors():
    status, _, body = asgi_get("/healthz")
    assert (status, json.loads(body)) == (200, {"status": "ok", "version": jobqueue.__version__})
    status, headers, body = asgi_get("/v1/workspaces/00000000-0000-0000-0000-000000000000/jobs",
                                     headers=[(b"host", b"testserver")])
    assert status == 401 and headers[b"Content-Type"] == b"application/json"
    assert json.loads(body)["code"] == "not_authenticated"
