"""Cron in a schedule's time zone (jobqueue/cron.py, on cronsim) across daylight-saving
changes, as cron users expect: Europe/Berlin springs forward on 2026-03-29 (02:00 -> 03:00)
and falls back on 2026-10-25 (03:00 -> 02:00); America/New_York on 2026-03-08 and
2026-11-01. Every fire time comes out in UTC."""

import datetime as dt
import itertools
from types import SimpleNamespace

import pytest

from jobqueue import cron
from jobqueue.exceptions import InvalidInput
from jobqueue.lifecycle.schedules import next_fire_times

UTC = dt.UTC


def _times(expr, zone, after, n):
    return list(itertools.islice(cron.fire_times(expr, cron.timezone(zone), after), n))


def _utc(*args):
    return dt.datetime(*args, tzinfo=UTC)


def test_a_fixed_time_in_the_skipped_hour_fires_right_after_the_spring_forward():
    # 02:30 does not exist in Berlin on 2026-03-29: it fires at 03:00 CEST (01:00 UTC), once.
    times = _times("30 2 * * *", "Europe/Berlin", _utc(2026, 3, 27, 12), 4)
    assert times == [_utc(2026, 3, 28, 1, 30), _utc(2026, 3, 29, 1, 0),
                     _utc(2026, 3, 30, 0, 30), _utc(2026, 3, 31, 0, 30)]
    assert all(t.tzinfo == UTC for t in times)


def test_a_fixed_time_in_the_repeated_hour_fires_once_at_the_fall_back():
    # 02:30 happens twice in Berlin on 2026-10-25 (CEST, then CET): it fires once, the first.
    times = _times("30 2 * * *", "Europe/Berlin", _utc(2026, 10, 24, 12), 3)
    assert times == [_utc(2026, 10, 25, 0, 30), _utc(2026, 10, 26, 1, 30),
                     _utc(2026, 10, 27, 1, 30)]


@pytest.mark.parametrize("expr,zone,after,first", [
    # From the second copy of the repeated hour (01:10 EST, 02:10 CET), the fixed time's
    # first copy has passed: the next is the next day's, never one before `after`.
    ("30 1 * * *", "America/New_York", _utc(2026, 11, 1, 6, 10), _utc(2026, 11, 2, 6, 30)),
    ("30 2 * * *", "Europe/Berlin", _utc(2026, 10, 25, 1, 10), _utc(2026, 10, 26, 1, 30)),
    ("0,30 2 * * *", "Europe/Berlin", _utc(2026, 10, 25, 1, 10), _utc(2026, 10, 26, 1, 0)),
    # A wildcard hour still fires in the second copy.
    ("30 * * * *", "America/New_York", _utc(2026, 11, 1, 6, 10), _utc(2026, 11, 1, 6, 30)),
])
def test_fire_times_from_the_repeated_hour_are_after_the_start(expr, zone, after, first):
    times = _times(expr, zone, after, 3)
    assert times[0] == first
    assert all(t > after for t in times) and times == sorted(set(times))
    assert cron.next_after(expr, cron.timezone(zone), after) == first


def test_an_hourly_schedule_fires_every_real_hour_across_both_changes():
    # Spring forward: 01:00 CET, then 03:00 CEST (no 02:00 that day): one hour apart in UTC.
    spring = _times("0 * * * *", "Europe/Berlin", _utc(2026, 3, 28, 23, 30), 4)
    assert spring == [_utc(2026, 3, 29, 0), _utc(2026, 3, 29, 1), _utc(2026, 3, 29, 2),
                      _utc(2026, 3, 29, 3)]
    # Fall back: 02:00 CEST and 02:00 CET both fire (an hour apart), no hour is lost.
    fall = _times("0 * * * *", "Europe/Berlin", _utc(2026, 10, 24, 22, 30), 4)
    assert fall == [_utc(2026, 10, 24, 23), _utc(2026, 10, 25, 0), _utc(2026, 10, 25, 1),
                    _utc(2026, 10, 25, 2)]


def test_new_york_nightly_across_both_changes():
    spring = _times("30 2 * * *", "America/New_York", _utc(2026, 3, 7, 12), 3)
    # 2026-03-08 02:30 does not exist: 03:00 EDT (07:00 UTC).
    assert spring == [_utc(2026, 3, 8, 7, 30) - dt.timedelta(minutes=30),
                      _utc(2026, 3, 9, 6, 30), _utc(2026, 3, 10, 6, 30)]
    fall = _times("30 1 * * *", "America/New_York", _utc(2026, 10, 31, 12), 3)
    # 2026-11-01 01:30 happens twice: once, at 01:30 EDT (05:30 UTC).
    assert fall == [_utc(2026, 11, 1, 5, 30), _utc(2026, 11, 2, 6, 30),
                    _utc(2026, 11, 3, 6, 30)]


def test_next_fire_times_follow_the_time_zone_and_answer_utc():
    schedule = SimpleNamespace(timezone="Europe/Berlin", cron="30 2 * * *", paused_at=None,
                               next_fire_at=_utc(2026, 3, 28, 1, 30))
    assert next_fire_times(schedule, _utc(2026, 3, 28, 0)) == [
        _utc(2026, 3, 28, 1, 30), _utc(2026, 3, 29, 1, 0), _utc(2026, 3, 30, 0, 30),
        _utc(2026, 3, 31, 0, 30), _utc(2026, 4, 1, 0, 30)]
    paused = SimpleNamespace(**{**vars(schedule), "paused_at": _utc(2026, 3, 1)})
    assert next_fire_times(paused, _utc(2026, 10, 24, 12), 2) == [
        _utc(2026, 10, 25, 0, 30), _utc(2026, 10, 26, 1, 30)]


def test_next_fire_times_end_with_the_calendar():
    schedule = SimpleNamespace(timezone="UTC", cron="0 0 29 2 *", paused_at=None,
                               next_fire_at=_utc(9992, 2, 29))
    assert next_fire_times(schedule, _utc(9990, 1, 1)) == [_utc(9992, 2, 29),
                                                           _utc(9996, 2, 29)]


@pytest.mark.parametrize("expr", ["", "* * * *", "* * * * * *", "61 * * * *", "0 0 30 2 *",
                                  "0 0 31 4,6 *", "a b c d e", "0 0 * * *\x00", "9" * 101])
def test_expressions_that_do_not_parse_or_never_fire_name_cron(expr):
    with pytest.raises(InvalidInput) as refused:
        cron.check(expr, cron.timezone("UTC"), _utc(2026, 1, 1))
    assert refused.value.context["field"] == "cron"
    assert expr not in refused.value.detail or not expr


def test_an_expression_with_no_fire_time_left_never_fires():
    # A leap day fires (every four years); with no leap day left before the calendar ends,
    # it never fires.
    assert cron.check("0 0 29 2 *", cron.timezone("UTC"), _utc(2026, 1, 1)) == "0 0 29 2 *"
    with pytest.raises(InvalidInput, match="never fires"):
        cron.check("0 0 29 2 *", cron.timezone("UTC"), _utc(9996, 3, 1))


@pytest.mark.parametrize("name", ["", "Mars/Olympus_Mons", "../../etc/passwd", "/etc/localtime",
                                  "Europe/Berlin\x00", "x" * 65, 5])
def test_unknown_time_zones_name_timezone(name):
    with pytest.raises(InvalidInput) as refused:
        cron.timezone(name)
    assert refused.value.context["field"] == "timezone"


def test_known_time_zones():
    assert str(cron.timezone("UTC")) == "UTC"
    assert str(cron.timezone("America/New_York")) == "America/New_York"
