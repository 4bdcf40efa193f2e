"""Cursor pagination: {"results", "next", "previous"}; `cursor` and `page_size` parameters.

Cursors are opaque and stable under inserts. A cursor that cannot be decoded is a 400.
"""

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import DataError
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import CursorPagination


class Cursor(CursorPagination):
    page_size = 100
    page_size_query_param = "page_size"
    max_page_size = 500
    ordering = "-created_at"

    def decode_cursor(self, request):
        try:
            return super().decode_cursor(request)
        except NotFound as exc:
            raise ValidationError({"cursor": ["Invalid cursor."]}) from exc

    def paginate_queryset(self, queryset, request, view=None):
        try:
            return super().paginate_queryset(queryset, request, view)
        except (ValueError, TypeError, OverflowError, DjangoValidationError, DataError) as exc:
            # A well-formed cursor whose position is not a value of the ordering field.
            raise ValidationError({"cursor": ["Invalid cursor."]}) from exc

    def get_page_size(self, request):
        raw = request.query_params.get(self.page_size_query_param)
        if raw is not None:
            try:
                value = int(raw)
            except ValueError:
                value = 0
            if not 1 <= value <= self.max_page_size:
                raise ValidationError(
                    {"page_size": [f"Must be an integer from 1 to {self.max_page_size}."]}
                )
        return super().get_page_size(request)


class NewestFirst(Cursor):
    ordering = ("-created_at", "-id")


class ClaimOrder(Cursor):
    """The order in which claim-next would take the jobs."""

    ordering = ("-priority", "available_at", "created_at")


class ByName(Cursor):
    ordering = ("name",)
