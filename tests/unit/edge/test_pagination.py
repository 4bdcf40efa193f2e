"""Signed pagination cursors and page sizes, without a database: what a cursor encodes, that
only the service's own cursors for the same listing are accepted, and the page-size bounds.
Paging through real rows is in tests/integration/api/test_errors.py."""

import uuid
from urllib.parse import parse_qs, urlsplit

import pytest
from django.core import signing
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.test import APIRequestFactory

from agents.pagination import KeysetPagination

LISTING = "/v1/workspaces/w1/jobs"


def request(path=LISTING, **params):
    return Request(APIRequestFactory().get(path, params))


def issued(direction="n", pk=None, path=LISTING, **params):
    """A cursor as the service hands it out, in the `next` URL of a page."""
    pager = KeysetPagination()
    pager.request = request(path, **params)
    url = pager.encode_cursor(direction, pk or uuid.uuid4())
    [cursor] = parse_qs(urlsplit(url).query)["cursor"]
    return url, cursor


def test_a_cursor_round_trips_its_direction_and_row():
    pk = uuid.uuid4()
    for direction in ("n", "p"):
        _, cursor = issued(direction, pk)
        assert KeysetPagination().decode_cursor(request(cursor=cursor)) == (direction, pk)


def test_no_cursor_is_the_first_page_forwards():
    assert KeysetPagination().decode_cursor(request()) == ("n", None)


def test_the_next_url_keeps_the_other_parameters_and_replaces_the_cursor():
    url, cursor = issued(path=LISTING, status="queued", cursor="old")
    assert url.startswith("http://testserver/v1/workspaces/w1/jobs?")
    assert "status=queued" in url and url.count("cursor=") == 1 and "old" not in url
    assert cursor.startswith("n.")  # the direction and row, readable, then the signature


@pytest.mark.parametrize("forged", [
    "bogus", "", "n.not-a-uuid", f"n.{uuid.uuid4()}", f"n.{uuid.uuid4()}:forged-signature",
])
def test_a_cursor_the_service_did_not_sign_is_refused(forged):
    with pytest.raises(ValidationError) as exc:
        KeysetPagination().decode_cursor(request(cursor=forged))
    assert exc.value.detail == {"cursor": ["Invalid cursor."]}


def test_a_cursor_issued_for_one_listing_is_refused_on_another():
    _, cursor = issued(path="/v1/workspaces/w1/jobs")
    assert KeysetPagination().decode_cursor(request("/v1/workspaces/w1/jobs", cursor=cursor))
    for other in ("/v1/workspaces/w2/jobs", "/v1/workspaces/w1/job-agents/a/jobs"):
        with pytest.raises(ValidationError):
            KeysetPagination().decode_cursor(request(other, cursor=cursor))


@pytest.mark.parametrize("text", ["x.8c3e0e8e-4a8b-4c8e-9c8e-8c3e0e8e4a8b", "n", "p:uuid"])
def test_a_signed_cursor_with_a_bad_payload_is_refused(text):
    signer = signing.Signer(salt=f"jobqueue.cursor:{LISTING}")
    with pytest.raises(ValidationError):
        KeysetPagination().decode_cursor(request(cursor=signer.sign(text)))


@pytest.mark.parametrize(("raw", "size"), [(None, 100), ("1", 1), ("500", 500), ("37", 37)])
def test_page_size_defaults_and_bounds(raw, size):
    params = {} if raw is None else {"page_size": raw}
    assert KeysetPagination().get_page_size(request(**params)) == size


@pytest.mark.parametrize("raw", ["0", "501", "-1", "x", "1.5", ""])
def test_page_size_outside_its_bounds_is_refused(raw):
    with pytest.raises(ValidationError) as exc:
        KeysetPagination().get_page_size(request(page_size=raw))
    assert exc.value.detail == {"page_size": ["Must be an integer from 1 to 500."]}


def test_a_by_key_cursor_names_an_integer_row():
    """Rate limits and fairness keys page by an integer primary key: a signed cursor of this
    listing whose row is not one (a UUID, text) is refused like a forged one."""
    from agents.pagination import ByKey

    path = "/v1/workspaces/w1/rate-limits"
    pager = ByKey()
    pager.request = request(path)
    for row, ok in ((42, True), (uuid.uuid4(), False), ("4a", False)):
        url = pager.encode_cursor("n", row)
        [cursor] = parse_qs(urlsplit(url).query)["cursor"]
        if ok:
            assert ByKey().decode_cursor(request(path, cursor=cursor)) == ("n", 42)
        else:
            with pytest.raises(ValidationError):
                ByKey().decode_cursor(request(path, cursor=cursor))
