"""The API's one error mapping: every error body is {"code", "detail"[, "fields"]}.

Domain errors (jobqueue.exceptions) and DRF's own errors are mapped here and nowhere else.
No error quotes what the client sent (a body field, the media type, the method), so a secret
sent in a request never comes back in an error response: messages name the field and the
rule, and a message that would still quote a string from the body is replaced (below).
"""

from __future__ import annotations

import functools
import logging

from django import db
from django.core.exceptions import DisallowedHost
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404, JsonResponse
from rest_framework import exceptions as drf
from rest_framework import status
from rest_framework.request import Empty
from rest_framework.response import Response

from jobqueue import exceptions as domain

log = logging.getLogger("agents.api")

DOMAIN_STATUS = {
    domain.NotFound: status.HTTP_404_NOT_FOUND,
    domain.InvalidInput: status.HTTP_400_BAD_REQUEST,
    domain.Conflict: status.HTTP_409_CONFLICT,
    domain.IdempotencyKeyReused: status.HTTP_422_UNPROCESSABLE_ENTITY,
    domain.LogRangeGap: status.HTTP_416_REQUESTED_RANGE_NOT_SATISFIABLE,
    domain.OutputTooLarge: status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
}

# DRF exception class -> stable code (the ones whose DRF default_code differs from ours).
DRF_CODES = {
    # (looked up along the exception's MRO: a subclass's own code comes first)
    drf.ValidationError: "validation_error",
    drf.ParseError: "validation_error",
    drf.NotAuthenticated: "not_authenticated",
    drf.AuthenticationFailed: "authentication_failed",
    drf.PermissionDenied: "permission_denied",
    drf.NotFound: "not_found",
    drf.MethodNotAllowed: "method_not_allowed",
    drf.NotAcceptable: "not_acceptable",
    drf.UnsupportedMediaType: "unsupported_media_type",
    drf.Throttled: "throttled",
}


class TokenExpired(drf.AuthenticationFailed):
    """An agent token past its expires_at (401, like every refused credential)."""

    default_detail = "This agent token has expired; rotate before it expires, or issue a new one."
    default_code = "token_expired"


class RegistrationTokenInvalid(drf.AuthenticationFailed):
    """POST /v1/register with a registration token that is unknown, revoked, expired or used
    up: one answer for all (401)."""

    default_detail = "The registration token is unknown, revoked, expired or used up."
    default_code = "registration_token_invalid"


class LabelsNotAllowed(drf.PermissionDenied):
    default_detail = "The labels asked for are not a subset of the registration token's."
    default_code = "labels_not_allowed"


DRF_CODES[TokenExpired] = "token_expired"
DRF_CODES[RegistrationTokenInvalid] = "registration_token_invalid"
DRF_CODES[LabelsNotAllowed] = "labels_not_allowed"


class PayloadTooLarge(drf.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "The request body is too large."
    default_code = "payload_too_large"


def error_body(code: str, detail: str, fields: dict | None = None) -> dict:
    body = {"code": code, "detail": str(detail)}
    if fields:
        body["fields"] = fields
    return body


def _flatten(detail) -> list[tuple[str, str]]:
    """DRF's nested error detail -> [(where, message)]: `where` is the path to the message
    inside its field ("0: status: "), made of field names, list indices and the names of
    unknown fields (which an error names on purpose); the message is what may quote input."""
    if isinstance(detail, dict):
        return [(f"{key}: {where}", msg)
                for key, value in detail.items() for where, msg in _flatten(value)]
    if isinstance(detail, (list, tuple)):
        return [pair for item in detail for pair in _flatten(item)]
    return [("", str(detail))]


def _fields(detail, scrub=lambda message: message) -> dict:
    """DRF's nested error detail -> {"field": ["where: msg", ...]}, each message scrubbed."""
    if not isinstance(detail, dict):
        detail = {"non_field_errors": detail}
    return {str(key): [where + scrub(msg) for where, msg in _flatten(value)]
            for key, value in detail.items()}


# --- never echo the input -------------------------------------------------------------
# Our messages name the field and the rule. DRF's defaults may quote the value (ChoiceField:
# '"<value>" is not a valid choice.'); our fields override those, and as a last guard any
# message that still contains a string the client sent, as a whole token, is replaced.

ECHO_MIN_LENGTH = 4
REPLACEMENT = "Invalid value."


def _sent_strings(request) -> list[str]:
    """The strings (keys and values) of the request body DRF parsed, if it parsed one, but
    the API's own words: its field names and the values its choice fields allow (a message
    that names `max_attempts` or `failure` quotes the API, not the body)."""
    data = getattr(request, "_full_data", Empty)
    if data is Empty:
        return []
    vocabulary = _vocabulary()
    found, stack = [], [data]
    while stack and len(found) < 10_000:
        item = stack.pop()
        if isinstance(item, str):
            if len(item) >= ECHO_MIN_LENGTH and item.lower() not in vocabulary:
                found.append(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return found


@functools.cache
def _vocabulary() -> frozenset[str]:
    from .serializers import vocabulary

    return vocabulary()


def _quotes(message: str, sent: list[str]) -> bool:
    lowered = message.lower()
    for value in sent:
        value = value.lower()
        start = lowered.find(value)
        while start >= 0:
            end = start + len(value)
            before = lowered[start - 1] if start else " "
            after = lowered[end] if end < len(lowered) else " "
            if not (before.isalnum() or before in "_-") and not (
                after.isalnum() or after in "_-"
            ):
                return True
            start = lowered.find(value, start + 1)
    return False


def _scrub(message: str, sent: list[str]) -> str:
    return REPLACEMENT if sent and _quotes(message, sent) else message


def _domain_response(exc: domain.JobQueueError, sent: list[str]) -> Response:
    code = exc.code
    http_status = next(
        (st for cls, st in DOMAIN_STATUS.items() if isinstance(exc, cls)),
        status.HTTP_400_BAD_REQUEST,
    )
    detail = exc.detail
    fields = None
    if isinstance(exc, domain.InvalidInput):
        detail = _scrub(detail, sent)
        if exc.context.get("field"):
            fields = {exc.context["field"]: [detail]}
    headers = {}
    if isinstance(exc, domain.LogRangeGap | domain.OutputTooLarge) and "length" in exc.context:
        headers["Range"] = f"0-{exc.context['length']}"  # the log's length: resend from it
    return Response(error_body(code, detail, fields), status=http_status, headers=headers)


def _drf_code(exc: drf.APIException) -> str:
    for cls in type(exc).__mro__:
        if cls in DRF_CODES:
            return DRF_CODES[cls]
    return exc.default_code if isinstance(exc.default_code, str) else "error"


def _database_unavailable(exc) -> Response:
    """A lost connection (a pooler or server restart under the request), a deadlock, a lock
    or statement timeout: the client may retry. Whether a write sent on a connection that
    broke took effect is unknown; every agent write is safe to repeat (an identical report is
    answered as before, a heartbeat extends once more, a claim-next with an Idempotency-Key
    returns its claim)."""
    log.warning("database unavailable (%s: %s); answered 503", type(exc).__name__,
                str(exc).strip().splitlines()[0] if str(exc).strip() else "")
    body = error_body("database_unavailable",
                      "The database could not complete the request; retry after the "
                      "Retry-After seconds.")
    return Response(body, status=status.HTTP_503_SERVICE_UNAVAILABLE,
                    headers={"Retry-After": "1"})


def exception_handler(exc, context):
    """DRF's EXCEPTION_HANDLER. Returns None (a 500) only for real server faults."""
    request = (context or {}).get("request")
    if isinstance(exc, domain.JobQueueError):
        return _domain_response(exc, _sent_strings(request))
    if isinstance(exc, db.OperationalError | db.InterfaceError):
        return _database_unavailable(exc)
    if isinstance(exc, Http404):
        exc = drf.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = drf.PermissionDenied()
    if not isinstance(exc, drf.APIException):
        return None

    headers = {}
    auth_header = getattr(exc, "auth_header", None)
    if auth_header:
        headers["WWW-Authenticate"] = auth_header
    wait = getattr(exc, "wait", None)
    if isinstance(exc, drf.Throttled) and wait is not None:
        headers["Retry-After"] = str(max(1, int(wait + 0.999)))

    code = _drf_code(exc)
    if isinstance(exc, drf.ValidationError):
        sent = _sent_strings(request)
        body = error_body(code, "Invalid input.",
                          _fields(exc.detail, lambda message: _scrub(message, sent)))
    elif isinstance(exc, drf.ParseError):
        body = error_body(code, str(exc.detail))  # agents/parsers.py: never the body
    elif isinstance(exc, drf.Throttled):
        body = error_body(code, "Too many requests; retry after the Retry-After seconds.")
    elif isinstance(exc, drf.UnsupportedMediaType):  # DRF's detail quotes the media type
        body = error_body(code, "Send the body as application/json.")
    elif isinstance(exc, drf.MethodNotAllowed):  # ... and the method
        body = error_body(code, "Method not allowed here; the Allow header lists those that are.")
    else:
        detail = exc.detail if isinstance(exc.detail, str) else " ".join(
            where + msg for where, msg in _flatten(exc.detail))
        body = error_body(code, detail)
    return Response(body, status=exc.status_code, headers=headers)


# --- Django-level handlers (errors raised outside DRF), JSON under /v1/ -------------------
# handler400/403/404/500 in config/urls.py. Under /v1/ every error is {"code", "detail"} like
# the API's own; elsewhere (the admin) Django's HTML pages, as before. None of them reads the
# request body.

API_PREFIX = "/v1/"


def _is_api(request) -> bool:
    return request.path.startswith(API_PREFIX)


def _settle_post(request) -> None:
    """Django's HTML error views (requires_csrf_token) read request.POST. When reading it is
    what failed (a form in a charset Django refuses: BadRequest), every view and middleware
    layer would fail again, each adding a traceback; mark the form as unreadable instead, as
    Django itself does for an oversized one."""
    try:
        request.POST  # noqa: B018 - parse it once, or learn that it cannot be parsed
    except Exception:  # noqa: BLE001 - whatever went wrong was already reported
        request._mark_post_parse_error()


def bad_request_view(request, exception=None):
    if _is_api(request):
        if isinstance(exception, DisallowedHost):
            detail = "The Host header names a host this server does not serve."
        else:
            detail = "The request could not be read."
        return JsonResponse(error_body("bad_request", detail), status=400)
    from django.views.defaults import bad_request

    _settle_post(request)
    return bad_request(request, exception)


def permission_denied_view(request, exception=None):
    if _is_api(request):
        return JsonResponse(
            error_body("permission_denied", "You may not do this."), status=403
        )
    from django.views.defaults import permission_denied

    _settle_post(request)
    return permission_denied(request, exception)


def not_found_view(request, exception=None):
    if _is_api(request):
        return JsonResponse(error_body("not_found", "Not found."), status=404)
    from django.views.defaults import page_not_found

    _settle_post(request)
    return page_not_found(request, exception)


def server_error_view(request):
    if _is_api(request):
        return JsonResponse(error_body("server_error", "Internal server error."), status=500)
    from django.views.defaults import server_error

    _settle_post(request)
    return server_error(request)
