"""The API's one error mapping (agents/exceptions.py), called as DRF and Django call it: every
error becomes {"code", "detail"[, "fields"]} with its status; only real faults are left to the
500 handler. The same contract through real requests is in tests/integration/api."""

import json

import pytest
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.test import RequestFactory
from rest_framework import exceptions as drf

from agents import exceptions as edge
from jobqueue import exceptions as domain


def handled(exc):
    response = edge.exception_handler(exc, {})
    return response.status_code, response.data, response


@pytest.mark.parametrize(("exc", "status", "code"), [
    (domain.NotFound(), 404, "not_found"),
    (domain.InvalidInput("bad"), 400, "validation_error"),
    (domain.JobNotClaimable(), 409, "job_not_claimable"),
    (domain.AgentPaused(), 409, "agent_paused"),
    (domain.ClaimSuperseded(), 409, "claim_superseded"),
    (domain.LeaseExpired(), 409, "lease_expired"),
    (domain.JobCancelled(), 409, "job_cancelled"),
    (domain.JobFinished(), 409, "job_finished"),
    (domain.InvalidTransition(), 409, "invalid_transition"),
    (domain.IdempotencyKeyReused(), 422, "idempotency_key_reused"),
    (domain.JobQueueError(), 400, "jobqueue_error"),  # an unmapped domain error: a 400
])
def test_domain_errors_keep_their_code_and_get_their_status(exc, status, code):
    got_status, body, _ = handled(exc)
    assert (got_status, body) == (status, {"code": code, "detail": exc.detail})


def test_an_invalid_input_naming_its_field_says_so():
    _, body, _ = handled(domain.InvalidInput("Must be 1 to 10.", field="limit"))
    assert body == {"code": "validation_error", "detail": "Must be 1 to 10.",
                    "fields": {"limit": ["Must be 1 to 10."]}}


def test_django_404_and_403_raised_in_a_view_become_json():
    assert handled(Http404("no such thing"))[:2] == (404, {"code": "not_found",
                                                           "detail": "Not found."})
    status, body, _ = handled(PermissionDenied())
    assert status == 403 and body["code"] == "permission_denied"


def test_validation_errors_are_flattened_per_field():
    exc = drf.ValidationError({"claims": [{"job_id": ["Must be a UUID."]}, {}],
                               "limit": ["Too big.", "Not a number."]})
    status, body, _ = handled(exc)
    assert status == 400
    assert body == {"code": "validation_error", "detail": "Invalid input.", "fields": {
        "claims": ["job_id: Must be a UUID."], "limit": ["Too big.", "Not a number."]}}
    _, body, _ = handled(drf.ValidationError(["Give a body.", "Or a query."]))
    assert body["fields"] == {"non_field_errors": ["Give a body.", "Or a query."]}


def test_every_drf_error_gets_our_code_and_its_headers():
    assert handled(drf.ParseError("JSON parse error - x."))[1] == {
        "code": "validation_error", "detail": "JSON parse error - x."}
    status, body, _ = handled(drf.MethodNotAllowed("PATCH"))
    assert (status, body["code"]) == (405, "method_not_allowed")
    assert "PATCH" not in body["detail"]  # no error repeats what the client sent
    failed = drf.AuthenticationFailed("Invalid or revoked agent token.")
    failed.auth_header = "Bearer"  # set by DRF's view when it has an authenticator
    status, body, response = handled(failed)
    assert (status, body["code"], response["WWW-Authenticate"]) == (
        401, "authentication_failed", "Bearer")
    status, body, response = handled(drf.Throttled(wait=2.2))
    assert (status, body["code"], response["Retry-After"]) == (429, "throttled", "3")
    assert handled(drf.Throttled(wait=0.01))[2]["Retry-After"] == "1"
    assert "Retry-After" not in handled(drf.Throttled())[2]


def test_an_error_of_our_own_keeps_its_default_code():
    class Gone(drf.APIException):
        status_code = 410
        default_detail = "Gone for good."
        default_code = "gone"

    class Odd(drf.APIException):
        default_code = None

    assert handled(Gone())[:2] == (410, {"code": "gone", "detail": "Gone for good."})
    assert handled(edge.PayloadTooLarge())[:2] == (
        413, {"code": "payload_too_large", "detail": "The request body is too large."})
    assert handled(Odd("x"))[1]["code"] == "error"
    assert handled(drf.APIException(["a", "b"]))[1]["detail"] == "a b"


def test_a_real_fault_is_left_to_the_500_handler():
    assert edge.exception_handler(ValueError("bug"), {}) is None


@pytest.mark.parametrize(("view", "status", "code"), [
    (edge.not_found_view, 404, "not_found"), (edge.server_error_view, 500, "server_error"),
])
def test_the_django_level_handlers_answer_json_under_v1_and_html_elsewhere(view, status, code):
    api = view(RequestFactory().get("/v1/nothing/here"))
    assert api.status_code == status and api["Content-Type"] == "application/json"
    assert json.loads(api.content)["code"] == code
    page = view(RequestFactory().get("/admin/nothing/here"))
    assert page.status_code == status and page["Content-Type"].startswith("text/html")
