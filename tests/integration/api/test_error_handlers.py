"""Errors raised outside DRF (issue #17, items 3 and 4), DEBUG off, through the whole Django
stack: JSON {"code", "detail"} under /v1/ for 400, 403, 404 and 500 (a bad Host header
included), Django's HTML pages elsewhere; a form Django cannot read is a 400 logged as one
line, not a 500 with chained tracebacks. tests/integration/api/test_gunicorn.py repeats the
Host and form cases through a real gunicorn."""

import logging

import pytest
from django.test import Client, override_settings

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.integration.api.error_urls")]

UTF16_FORM = "application/x-www-form-urlencoded; charset=utf-16"


@pytest.fixture(autouse=True)
def _debug_off(settings):
    settings.DEBUG = False


def client(**kw):
    return Client(raise_request_exception=False, **kw)


def is_json_error(r, status, code):
    assert r.status_code == status, (r.status_code, r.content[:300])
    assert r["Content-Type"] == "application/json"
    body = r.json()
    assert set(body) == {"code", "detail"} and body["code"] == code and body["detail"]
    return body


def is_html(r, status):
    assert r.status_code == status, (r.status_code, r.content[:300])
    assert r["Content-Type"].startswith("text/html")
    assert b"<html" in r.content.lower()


@pytest.mark.parametrize(
    "name, status, code",
    [
        ("bad-request", 400, "bad_request"),
        ("suspicious", 400, "bad_request"),
        ("forbidden", 403, "permission_denied"),
        ("crash", 500, "server_error"),
        ("drf-crash", 500, "server_error"),
    ],
)
def test_errors_raised_outside_drf_are_json_under_v1_and_html_elsewhere(name, status, code):
    is_json_error(client().get(f"/v1/errors/{name}"), status, code)
    if name != "drf-crash":
        is_html(client().get(f"/errors/{name}"), status)


def test_unknown_urls_are_json_404_under_v1_and_html_elsewhere():
    is_json_error(client().get("/v1/no/such/thing"), 404, "not_found")
    is_json_error(client().post("/v1/errors", data="x=1", content_type=UTF16_FORM), 404,
                  "not_found")
    is_html(client().get("/no/such/thing"), 404)


@pytest.mark.parametrize("path", ["/v1/workspaces/x/jobs", "/v1/schema/", "/v1/nothing"])
def test_a_host_header_this_server_does_not_serve_is_json_400_under_v1(path):
    body = is_json_error(client().get(path, HTTP_HOST="evil.example"), 400, "bad_request")
    assert "evil" not in body["detail"]
    is_html(client().get("/admin/login/", HTTP_HOST="evil.example"), 400)


def test_a_bad_host_is_logged_as_one_warning_line(caplog):
    """Issue #32, item 12: each request with a Host this server does not serve logged a
    ~15-line traceback at ERROR (DisallowedHost, unauthenticated, as often as anyone likes).
    Now one line at WARNING, the host shown once, quoted and cut short."""
    caplog.set_level(logging.DEBUG)
    for path, host in [("/v1/workspaces/x/jobs", "evil.example"),
                       ("/admin/login/", "evil.example:8000"),
                       ("/v1/schema/", "x" * 5000)]:
        caplog.clear()
        assert client().get(path, HTTP_HOST=host).status_code == 400
        lines = log_lines(caplog)
        assert len(lines) == 1, "\n".join(lines[:40])
        [record] = caplog.records
        assert record.levelno == logging.WARNING and record.exc_info is None
        assert record.name == "django.security.DisallowedHost"
        assert lines[0].count(host[:100]) == 1 and len(lines[0]) < 500, lines[0]
        assert path in lines[0]


def admin_login_in_utf16():
    c = client(enforce_csrf_checks=True)
    c.cookies["csrftoken"] = "a" * 32
    return c.post("/admin/login/", data="username=a&password=b",  # sent as UTF-16
                  content_type=UTF16_FORM)


def log_lines(caplog) -> list[str]:
    return [line for r in caplog.records for line in caplog.handler.format(r).splitlines()]


def test_a_form_in_a_charset_django_refuses_is_400_logged_as_one_line(caplog):
    caplog.set_level(logging.DEBUG)
    r = admin_login_in_utf16()
    is_html(r, 400)
    lines = log_lines(caplog)
    assert len(lines) == 1, "\n".join(lines[:40])
    assert lines[0].startswith("WARNING") and "Bad Request: /admin/login/" in lines[0]
    # The same through the other form types' routes: an unknown admin URL, a known view.
    caplog.clear()
    is_html(client(enforce_csrf_checks=True).post("/admin/nothing/", data="a=b",
                                                  content_type=UTF16_FORM), 400)
    assert len(log_lines(caplog)) == 1


def test_too_many_form_fields_are_400_logged_as_one_security_line(caplog, settings):
    settings.DATA_UPLOAD_MAX_NUMBER_FIELDS = 10
    caplog.set_level(logging.DEBUG)
    c = client(enforce_csrf_checks=True)
    c.cookies["csrftoken"] = "a" * 32
    r = c.post("/admin/login/", data="&".join(f"f{i}=1" for i in range(20)),
               content_type="application/x-www-form-urlencoded")
    is_html(r, 400)
    lines = log_lines(caplog)
    assert len(lines) == 1, "\n".join(lines[:40])
    assert caplog.records[0].name == "django.security.TooManyFieldsSent"


def test_the_error_views_do_not_read_the_form_again(caplog, settings):
    """Without the middleware, Django raises BadRequest from CsrfViewMiddleware; the 400 view
    must not raise it again (which made it a 500 with a traceback per middleware layer)."""
    caplog.set_level(logging.DEBUG)
    middleware = [m for m in settings.MIDDLEWARE if not m.endswith("UnreadableFormMiddleware")]
    with override_settings(MIDDLEWARE=middleware):
        r = admin_login_in_utf16()
    is_html(r, 400)
    assert sum("Traceback" in line for line in log_lines(caplog)) == 1
    assert len(caplog.records) == 1


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_a_connection_lost_under_a_request_is_a_503_to_retry_not_a_500(caplog):
    """The server's database connection is killed (as a PgBouncer or PostgreSQL restart kills
    it) between two requests: the next request's statement fails on it, and the answer is a
    503 database_unavailable with Retry-After, which the agent retries; the next request opens
    a new connection and works."""
    import psycopg
    from django.db import connection

    from tests.integration.api.conftest import make_world

    world = make_world()
    agent = world.agent_caller()
    claim = f"job-agents/{world.agent.id}/jobs/claim"
    assert agent.post(claim).status_code == 204
    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        pid = cur.fetchone()[0]
    d = connection.settings_dict
    with psycopg.connect(host=d["HOST"] or "127.0.0.1", port=d["PORT"] or 5432,
                         user=d["USER"] or "postgres", dbname=d["NAME"],
                         autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])
    with caplog.at_level(logging.WARNING, logger="agents.api"):
        r = agent.post(claim)
    body = is_json_error(r, 503, "database_unavailable")
    assert r["Retry-After"] == "1" and "retry" in body["detail"].lower()
    assert "answered 503" in caplog.text
    connection.close()  # the server drops it at the request's end; the test client does not
    assert agent.post(claim).status_code == 204


def test_a_post_that_is_no_form_is_left_to_the_view(caplog):
    """Only form bodies are parsed early; anything else reaches CSRF and the view as sent
    (here: the CSRF refusal, 403, since the JSON body carries no token)."""
    caplog.set_level(logging.DEBUG)
    c = client(enforce_csrf_checks=True)
    r = c.post("/admin/login/", data='{"username": "a"}', content_type="application/json")
    assert r.status_code == 403 and "Bad Request" not in caplog.text
