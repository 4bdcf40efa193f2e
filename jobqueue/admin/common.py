"""What every admin page of the queue shares: the database's clock, how a span of time reads,
the operator's actor string, and name-or-id search."""

from __future__ import annotations

import datetime as dt

from django.contrib import admin
from django.core.exceptions import FieldDoesNotExist
from django.db.models import Q
from django.db.models.constants import LOOKUP_SEP
from django.utils.html import avoid_wrapping
from django.utils.timesince import timesince
from django.utils.translation import ngettext

from jobqueue import actors
from jobqueue.db import db_now
from jobqueue.lifecycle.inputs import parse_uuid
from jobqueue.models import Job, JobClaim


def operator_actor(request) -> str:
    """The actor of an admin repair, on job events and in log entries."""
    return actors.operator_actor(request.user.get_username())


def request_db_now(request) -> dt.datetime:
    """The database's clock, read once per request."""
    if not hasattr(request, "_jobqueue_db_now"):
        request._jobqueue_db_now = db_now()
    return request._jobqueue_db_now


def row_db_now(obj) -> dt.datetime:
    """The database's clock as annotated on a row by get_queryset() (`db_now`)."""
    now = getattr(obj, "db_now", None)
    return now if now is not None else db_now()


def span(a: dt.datetime, b: dt.datetime) -> str:
    """The time between two moments in words, either order: Django's timesince ("3 minutes",
    "1 hour, 5 minutes"), and below a minute, where timesince says "0 minutes", the seconds
    ("42 seconds"): leases are often shorter than a minute."""
    earlier, later = sorted((a, b))
    seconds = int((later - earlier).total_seconds())
    if seconds < 60:
        return avoid_wrapping(
            ngettext("%(num)d second", "%(num)d seconds", seconds) % {"num": seconds}
        )
    return timesince(earlier, later)


def seconds_span(seconds: float) -> str:
    """A duration given in seconds, in the same words as span()."""
    origin = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
    return span(origin, origin + dt.timedelta(seconds=seconds))


def describe_lease(expires_at, now) -> str:
    """ "expires in 42 seconds" or "expired 3 minutes ago", relative to the database's clock."""
    if expires_at > now:
        return f"expires in {span(now, expires_at)}"
    return f"expired {span(expires_at, now)} ago"


def describe_age(when, now, never="never") -> str:
    if when is None:
        return never
    return f"{span(when, now)} ago"


def claim_of(job: Job) -> JobClaim | None:
    try:
        return job.claim
    except JobClaim.DoesNotExist:
        return None


def id_or(queryset, search_term, q_for_term):
    """Admin search: `q_for_term(term)`, or the id equals the term (a term that is not a UUID
    never 500s). Returns get_search_results()'s (queryset, may_have_duplicates)."""
    term = search_term.strip()
    if not term:
        return queryset, False
    q = q_for_term(term)
    term_id = parse_uuid(term)
    if term_id is not None:
        q |= Q(id=term_id)
    return queryset.filter(q), False


def name_or_id_search(queryset, search_term):
    """Name contains the term, or the id equals it."""
    return id_or(queryset, search_term, lambda term: Q(name__icontains=term))


class OfferedFiltersOnly(admin.ModelAdmin):
    """A list page filters by what its list_filter offers, and by nothing else from the query
    string. Django allows any lookup on a model's own field (`?secret__regex=^whsec_a`,
    `?message__startswith=`, a JSON path into `job` or `payload`): a view-only operator could
    read a secret, or text the pages redact, one character at a time from the row count. A
    lookup on a field (or relation) of the model is allowed only when a list_filter entry
    names that field (its first part: `workspace` for `workspace__id__exact`), and then as
    Django allows it; a SimpleListFilter's parameter (not a field) is its own to read."""

    def lookup_allowed(self, lookup, value, request=None):
        first = lookup.split(LOOKUP_SEP, 1)[0]
        offered, own = set(), set()
        for item in self.get_list_filter(request):
            name = item[0] if isinstance(item, tuple | list) else item
            if isinstance(name, str):  # a field, or (a field, its FieldListFilter)
                offered.add(name.split(LOOKUP_SEP, 1)[0])
            else:  # a SimpleListFilter
                own.add(name.parameter_name)
        if lookup in own:  # the filter reads it itself (an exact match)
            return super().lookup_allowed(lookup, value, request)
        try:
            self.model._meta.get_field(first)
        except FieldDoesNotExist:  # not a field: Django's ChangeList refuses what no
            return super().lookup_allowed(lookup, value, request)  # filter reads
        return first in offered and super().lookup_allowed(lookup, value, request)

