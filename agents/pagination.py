"""Keyset ("cursor") pagination: {"results", "next", "previous"}; `cursor`, `page_size`.

Each view orders by a few fields ending with the primary key, so the order is total. A cursor
names a direction and the row at the edge of the page; the next page is the rows after that
row in the ordering, compared in SQL against the row's stored values (subqueries on the
primary key). So ties are never skipped or repeated, whatever the clock's resolution, and the
comparison reads stored values on both backends. A cursor that cannot be decoded is a 400.

Cursors are signed (SECRET_KEY, salted with the request's path): a caller can only hand back
a cursor the service gave it for that listing, so it cannot aim one at a row of another
workspace or agent and learn from the page whether that row exists.
"""

from __future__ import annotations

import uuid

from django.core import signing
from django.db.models import Q, Subquery
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.utils.urls import remove_query_param, replace_query_param

from jobqueue import claimrule
from jobqueue.models import CLAIM_ORDER

from .query import query_int


class KeysetPagination:
    ordering: tuple[str, ...] = ("-created_at", "-id")
    page_size = 100
    max_page_size = 500
    cursor_query_param = "cursor"
    page_size_query_param = "page_size"

    def paginate_queryset(self, queryset, request, view=None):
        self.request = request
        size = self.get_page_size(request)
        direction, anchor = self.decode_cursor(request)
        order = self.ordering if direction == "n" else tuple(_flip(f) for f in self.ordering)
        aliases = self.aliases()
        qs = queryset.alias(**aliases).order_by(*order)
        if anchor is not None:
            qs = qs.filter(_after(queryset.model, order, anchor, aliases))
        rows = list(qs[: size + 1])
        more = len(rows) > size
        rows = rows[:size]
        if direction == "p":
            rows.reverse()
        first = rows[0].pk if rows else None
        last = rows[-1].pk if rows else None
        if direction == "n":
            self.next = self.encode_cursor("n", last) if more else None
            self.previous = self.encode_cursor("p", first) if anchor and rows else None
        else:
            self.next = self.encode_cursor("n", last) if rows else None
            self.previous = self.encode_cursor("p", first) if more else None
        return rows

    def get_paginated_response(self, data):
        return Response({"results": data, "next": self.next, "previous": self.previous})

    def get_page_size(self, request) -> int:
        value = query_int(request, self.page_size_query_param, 1, self.max_page_size)
        return self.page_size if value is None else value

    def _signer(self, request) -> signing.Signer:
        return signing.Signer(salt=f"jobqueue.cursor:{request.path}")

    def decode_cursor(self, request):
        raw = request.query_params.get(self.cursor_query_param)
        if raw is None:
            return "n", None
        try:
            text = self._signer(request).unsign(raw)
            direction, anchor = text.split(".", 1)
            if direction not in ("n", "p"):
                raise ValueError(direction)
            return direction, self.parse_anchor(anchor)
        except (ValueError, signing.BadSignature) as exc:
            raise ValidationError({"cursor": ["Invalid cursor."]}) from exc

    def aliases(self) -> dict:
        """Expressions the ordering names (none but the claim order's claim_at)."""
        return {}

    def parse_anchor(self, text: str):
        """The primary key a cursor names (a UUID; ValueError when it is not one)."""
        return uuid.UUID(text)

    def encode_cursor(self, direction: str, pk) -> str:
        token = self._signer(self.request).sign(f"{direction}.{pk}")
        url = self.request.build_absolute_uri()
        return replace_query_param(remove_query_param(url, "cursor"), "cursor", token)


def _flip(field: str) -> str:
    return field[1:] if field.startswith("-") else "-" + field


def _after(model, order, anchor, aliases=None):
    """Rows strictly after the anchor row in `order` (lexicographic, in SQL)."""
    ref = model._default_manager.filter(pk=anchor).annotate(**(aliases or {}))

    def value(name):
        return Subquery(ref.values(name)[:1])

    condition = None
    for i, field in enumerate(order):
        name = field.lstrip("-")
        op = "lt" if field.startswith("-") else "gt"
        term = Q(**{f"{name}__{op}": value(name)})
        for earlier in order[:i]:
            term &= Q(**{earlier.lstrip("-"): value(earlier.lstrip("-"))})
        condition = term if condition is None else condition | term
    return condition


class NewestFirst(KeysetPagination):
    ordering = ("-created_at", "-id")


class ClaimOrder(KeysetPagination):
    """The order in which claim-next would take the jobs."""

    ordering = (*CLAIM_ORDER, "id")

    def aliases(self) -> dict:
        return {"claim_at": claimrule.claim_at()}


class ByName(KeysetPagination):
    ordering = ("name", "id")


class ByKey(KeysetPagination):
    """A workspace's rate limits or fairness keys by key (unique in it); their primary key is
    an integer."""

    ordering = ("key", "id")

    def parse_anchor(self, text: str) -> int:
        if not text.isascii() or not text.isdigit():
            raise ValueError(text)
        return int(text)
