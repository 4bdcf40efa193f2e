"""The clock rules of an attempt, for every backend: when its deadline falls, where its lease
ends, whether a holder may still write, how long a retry waits. Each is computed by the
database (Now(), the statement's time), never by the app server; the PostgreSQL statements
(jobqueue/sql/postgresql.sql) compute the same in SQL, and the clock tests hold both to
them (tests/integration/core/test_clocks*.py).
"""

from __future__ import annotations

import datetime as dt

from django.db.models import Case, DateTimeField, F, FloatField, Q, Value, When
from django.db.models.functions import Coalesce, Least, Now, Power, Random

from jobqueue import states
from jobqueue.conf import jobqueue_settings
from jobqueue.db import NowPlusSeconds


def attempt_deadline(job, now: dt.datetime) -> dt.datetime | None:
    """When a clock ends the attempt claimed at the database time `now`: the earlier of
    now + max_runtime_seconds and expires_at (None: neither)."""
    ends = [t for t in (
        None if job.max_runtime_seconds is None
        else now + dt.timedelta(seconds=job.max_runtime_seconds),
        job.expires_at,
    ) if t is not None]
    return min(ends) if ends else None


def lease_end(now: dt.datetime, lease: int, deadline: dt.datetime | None) -> dt.datetime:
    """The lease of a claim made at `now`, never past the attempt's deadline."""
    end = now + dt.timedelta(seconds=lease)
    return end if deadline is None else min(end, deadline)


def within_deadline() -> Q:
    """No clock has ended the job's running attempt yet (by the database's clock): the
    guard of every holder's write but heartbeats (which see the claim's capped lease)."""
    return (
        (Q(max_runtime_seconds__isnull=True)
         | Q(started_at__gt=NowPlusSeconds(F("max_runtime_seconds") * -1)))
        & (Q(expires_at__isnull=True) | Q(expires_at__gt=Now()))
    )


def retry_backoff():
    """The wait before a retry, in seconds, as the database computes it from the job row:
    retry_backoff_seconds (or the default) doubled per attempt already made, at most
    MAX_RETRY_BACKOFF_SECONDS, shortened by up to RETRY_JITTER of itself."""
    conf = jobqueue_settings()
    base = Coalesce(F("retry_backoff_seconds"), Value(conf["RETRY_BACKOFF_SECONDS"]))
    wait = Least(
        Value(float(conf["MAX_RETRY_BACKOFF_SECONDS"]), output_field=FloatField()),
        base * Power(Value(2.0), F("attempt") - 1), output_field=FloatField(),
    )
    if conf["RETRY_JITTER"]:
        wait = wait * (Value(1.0) - Value(float(conf["RETRY_JITTER"])) * Random())
    return wait


def retry_fields() -> dict:
    """A retryable failure's update: queued after the backoff while attempts remain, else
    failure (the guards are the report's)."""
    again = Q(attempt__lt=F("max_attempts"))
    return {
        "status": Case(When(again, then=Value(states.QUEUED)), default=Value(states.FAILURE)),
        "completed_at": Case(When(again, then=Value(None)), default=Now(),
                             output_field=DateTimeField()),
        "available_at": Case(When(again, then=NowPlusSeconds(retry_backoff())),
                             default=F("available_at")),
    }


def backoff_settings() -> dict:
    """The retry backoff's settings, as the PostgreSQL statements take them."""
    conf = jobqueue_settings()
    return {"backoff": conf["RETRY_BACKOFF_SECONDS"],
            "backoff_cap": conf["MAX_RETRY_BACKOFF_SECONDS"],
            "jitter": float(conf["RETRY_JITTER"])}
