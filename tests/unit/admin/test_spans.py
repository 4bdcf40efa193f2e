"""How the admin words a span of time (jobqueue.admin.common): Django's timesince, with seconds
below a minute, relative to a clock it is given (the database's, on the pages)."""

import datetime as dt

import pytest

from jobqueue.admin.common import describe_age, describe_lease, seconds_span, span

NOW = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.UTC)
NBSP = "\xa0"  # timesince keeps a number and its unit on one line


@pytest.mark.parametrize(
    "seconds, words",
    [
        (0, "0 seconds"),
        (1, "1 second"),
        (59, "59 seconds"),
        (60, "1 minute"),
        (61, "1 minute"),
        (150, "2 minutes"),
        (3600, "1 hour"),
        (3900, "1 hour, 5 minutes"),
        (2 * 86400 + 3 * 3600, "2 days, 3 hours"),
    ],
)
def test_span_reads_like_timesince_with_seconds_below_a_minute(seconds, words):
    later = NOW + dt.timedelta(seconds=seconds)
    expected = words.replace(" ", NBSP).replace("," + NBSP, ", ")
    assert span(NOW, later) == expected
    assert span(later, NOW) == expected  # either order
    assert seconds_span(seconds) == expected


def test_leases_and_ages_relative_to_the_given_clock():
    assert describe_lease(NOW + dt.timedelta(seconds=42), NOW) == f"expires in 42{NBSP}seconds"
    assert describe_lease(NOW - dt.timedelta(minutes=3), NOW) == f"expired 3{NBSP}minutes ago"
    assert describe_lease(NOW, NOW) == f"expired 0{NBSP}seconds ago"  # the expiry is the cut
    assert describe_age(NOW - dt.timedelta(seconds=5), NOW) == f"5{NBSP}seconds ago"
    assert describe_age(None, NOW) == "never"
    assert describe_age(None, NOW, never="none yet") == "none yet"
