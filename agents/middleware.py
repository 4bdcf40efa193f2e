"""Request size cap for the HTTP API, enforced before anything reads the body; forms Django
cannot read refused before CSRF reads them (UnreadableFormMiddleware, below); and a Host this
server does not serve refused in one log line (DisallowedHostMiddleware).

`JOBQUEUE["MAX_REQUEST_BYTES"]` (env `JOBQUEUE_MAX_REQUEST_BYTES`, default 1 MiB) bounds every
request body under /v1/. A declared Content-Length above it is refused at once. A chunked body
(no Content-Length) is read here, at most one byte past the cap, when the server marks its
input as terminated (gunicorn does: `wsgi.input_terminated`); the body read is then handed on
with its real length. A server that cannot tell where a chunked body ends gets 411.
"""

from __future__ import annotations

import io
import logging
import re
import threading

from django.conf import settings
from django.core.exceptions import BadRequest, DisallowedHost, SuspiciousOperation
from django.core.handlers.wsgi import LimitedStream
from django.http import JsonResponse
from django.http.multipartparser import MultiPartParserError
from django.utils.log import log_response

from jobqueue.conf import jobqueue_settings

from .bodies import BODY_READ_ERRORS, IncompleteBody

API_PREFIX = "/v1/"


def max_request_bytes() -> int:
    return int(jobqueue_settings()["MAX_REQUEST_BYTES"])


def _error(status: int, code: str, detail: str) -> JsonResponse:
    return JsonResponse({"code": code, "detail": detail}, status=status)


def _too_large(cap: int) -> JsonResponse:
    return _error(413, "payload_too_large", f"The request body is larger than {cap} bytes.")


# An artifact upload streams to storage under its own cap (JOBQUEUE_MAX_ARTIFACT_BYTES,
# enforced by the view as it reads): this cap does not apply to it.
ARTIFACT_UPLOAD = re.compile(r"/v1/workspaces/[^/]+/jobs/[^/]+/artifacts/[^/]+")


class RequestSizeLimitMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.path.startswith(API_PREFIX) and not (
            request.method == "PUT" and ARTIFACT_UPLOAD.fullmatch(request.path)
        ):
            refusal = self._check(request)
            if refusal is not None:
                return refusal
        return self.get_response(request)

    def _check(self, request):
        cap = max_request_bytes()
        meta = request.META
        raw_length = meta.get("CONTENT_LENGTH")
        if raw_length not in (None, ""):
            try:
                length = int(raw_length)
            except ValueError:
                return _error(400, "validation_error", "Content-Length must be an integer.")
            if length > cap:
                return _too_large(cap)
            return None
        if "chunked" not in meta.get("HTTP_TRANSFER_ENCODING", "").lower():
            return None
        stream = meta.get("wsgi.input")
        if stream is None or not meta.get("wsgi.input_terminated"):
            return _error(
                411, "length_required", "Send a Content-Length header with the request body."
            )
        chunks, size = [], 0
        try:
            while size <= cap:
                chunk = stream.read(min(65536, cap + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
        except BODY_READ_ERRORS:  # cut short: nothing of it is taken
            return _error(400, IncompleteBody.default_code, IncompleteBody.default_detail)
        if size > cap:
            return _too_large(cap)
        body = b"".join(chunks)
        meta["CONTENT_LENGTH"] = str(len(body))
        request._stream = LimitedStream(io.BytesIO(body), len(body))
        return None


class UnreadableFormMiddleware:
    """A POSTed form that Django cannot read gets a 400 here, logged as one line, before
    CsrfViewMiddleware reads it (and raises from deep inside the handler).

    Django refuses an `application/x-www-form-urlencoded` body in any charset but UTF-8 with
    BadRequest, raised wherever request.POST is first read: in CsrfViewMiddleware, then again
    in every error view wrapped in requires_csrf_token, each adding a traceback (a 500 and
    ~700 log lines for one unauthenticated request to /admin/login/). Too many fields or an
    oversized form are refused the same way, on Django's security logger. The API (/v1/)
    reads no forms and is left alone."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.method == "POST" and not request.path.startswith(API_PREFIX):
            refusal = self._check(request)
            if refusal is not None:
                return refusal
        return self.get_response(request)

    def _check(self, request):
        if request.content_type not in ("application/x-www-form-urlencoded",
                                        "multipart/form-data"):
            return None
        try:
            request.POST  # noqa: B018 - parse it now, as CsrfViewMiddleware would
        except (BadRequest, SuspiciousOperation, MultiPartParserError) as exc:
            request._mark_post_parse_error()  # nothing reads it again
            return self._refuse(request, exc)
        return None

    def _refuse(self, request, exc):
        from .exceptions import bad_request_view

        response = bad_request_view(request, exc)
        if isinstance(exc, SuspiciousOperation):
            logger = logging.getLogger(f"django.security.{type(exc).__name__}")
            log_response("%s: %s", str(exc), request.path, response=response, request=request,
                         logger=logger, level="error")
        else:
            log_response("Bad Request: %s (%s)", request.path, str(exc), response=response,
                         request=request)
        return response


class DisallowedHostMiddleware:
    """A Host header this server does not serve (DJANGO_ALLOWED_HOSTS) gets its 400 here,
    logged as one WARNING line on Django's security logger, before any other layer asks for
    the host. Left to Django, every such request, unauthenticated, logged a traceback of
    ~15 lines at ERROR (CommonMiddleware's get_host() raises DisallowedHost)."""

    MAX_LOGGED_HOST = 100

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        try:
            request.get_host()
        except DisallowedHost as exc:
            return self._refuse(request, exc)
        return self.get_response(request)

    def _refuse(self, request, exc):
        from .exceptions import bad_request_view

        response = bad_request_view(request, exc)
        host = request.META.get("HTTP_X_FORWARDED_HOST") if settings.USE_X_FORWARDED_HOST \
            else None
        host = host or request.META.get("HTTP_HOST") or request.META.get("SERVER_NAME", "")
        cut = self.MAX_LOGGED_HOST
        shown = repr(host[:cut]) + ("..." if len(host) > cut else "")
        log_response("Refused a Host not in DJANGO_ALLOWED_HOSTS: %s: %s", shown, request.path,
                     response=response, request=request,
                     logger=logging.getLogger("django.security.DisallowedHost"),
                     level="warning")
        return response


# --- client versions ---------------------------------------------------------------------

# What every jobqueue_client sends: `jobqueue-client/<version>` in its User-Agent.
CLIENT_VERSION = re.compile(r"\bjobqueue-client/((\d{1,6})\.(\d{1,6})[0-9A-Za-z.+-]{0,40})")
# Distinct old versions logged per process; past it, one last line says that more came.
MAX_LOGGED_CLIENT_VERSIONS = 100
client_log = logging.getLogger("agents.clients")


def min_client_version() -> tuple[int, int]:
    """JOBQUEUE_MIN_CLIENT_VERSION as (major, minor); settings.py refuses a malformed one."""
    major, _, minor = str(jobqueue_settings().get("MIN_CLIENT_VERSION") or "0.0").partition(".")
    return int(major), int(minor or 0)


class ClientVersionMiddleware:
    """Logs, once per version and process (WARNING, one line), an API request from a
    jobqueue-client older than JOBQUEUE_MIN_CLIENT_VERSION (major.minor). The request is
    served all the same: the log tells the operator which agents to upgrade before a release
    that drops what they rely on. Other User-Agents (curl, a generated client) are not
    judged."""

    def __init__(self, get_response):
        self.get_response = get_response
        self.logged: set[str] = set()
        self.lock = threading.Lock()

    def __call__(self, request):
        if request.path.startswith(API_PREFIX):
            match = CLIENT_VERSION.search(request.META.get("HTTP_USER_AGENT", ""))
            if match and (int(match[2]), int(match[3])) < min_client_version():
                self._warn(match[1])
        return self.get_response(request)

    def _warn(self, version: str) -> None:
        with self.lock:
            if version in self.logged or len(self.logged) > MAX_LOGGED_CLIENT_VERSIONS:
                return
            self.logged.add(version)
            last = len(self.logged) > MAX_LOGGED_CLIENT_VERSIONS
        minimum = ".".join(map(str, min_client_version()))
        if last:
            client_log.warning("unsupported clients: more than %d old versions seen; no more "
                               "are logged until a restart", MAX_LOGGED_CLIENT_VERSIONS)
            return
        client_log.warning("unsupported client: jobqueue-client/%s is older than %s "
                           "(JOBQUEUE_MIN_CLIENT_VERSION); upgrade the agents or producers "
                           "that run it", version, minimum)
