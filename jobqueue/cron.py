"""Cron expressions in a time zone: a schedule's fire times (docs/api.md, "Schedules").

The evaluation is cronsim's (healthchecks.io's cron library, pinned in requirements.txt),
not ours: five fields as Debian cron reads them (names, ranges, steps, `L`, `#`), in the
schedule's IANA time zone, across daylight-saving changes as cron users expect. A time that a
spring-forward skips fires at the first minute after the gap ("30 2 * * *" in Europe/Berlin on
the last Sunday of March fires at 03:00); a time that a fall-back repeats fires once, at its
first occurrence, unless the expression has a wildcard minute or hour ("0 * * * *" fires at
both 02:00s). Every fire time leaves here in UTC.
"""

from __future__ import annotations

import datetime as dt
import zoneinfo
from collections.abc import Iterator

from cronsim import CronSim, CronSimError

from .exceptions import InvalidInput

MAX_CRON_LENGTH = 100
MAX_TIMEZONE_LENGTH = 64


def timezone(name: str) -> zoneinfo.ZoneInfo:
    """The IANA time zone `name`; anything else is a 400 naming `timezone` (the message
    never repeats the name)."""
    if (not isinstance(name, str) or not 1 <= len(name) <= MAX_TIMEZONE_LENGTH
            or not name.isprintable() or name.startswith(("/", ".")) or ".." in name):
        raise InvalidInput("timezone must be an IANA time zone name, e.g. Europe/Berlin.",
                           field="timezone")
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise InvalidInput("timezone must be an IANA time zone name, e.g. Europe/Berlin.",
                           field="timezone") from exc


def fire_times(expr: str, tz: zoneinfo.ZoneInfo, after: dt.datetime) -> Iterator[dt.datetime]:
    """The fire times of `expr` in `tz` strictly after `after` (aware), in UTC, in order; it
    ends when none is left within 50 years (cronsim's horizon) or before the year 9999."""
    it = CronSim(expr, after.astimezone(tz))
    while True:
        try:
            when = next(it).astimezone(dt.UTC)
        except (StopIteration, OverflowError):
            return
        # Started in the second copy of a fall-back's repeated hour, cronsim answers a fixed
        # time of that hour at its first copy, which has passed ("30 1 * * *" in New York
        # from 01:10 EST: 01:30 EDT): that fire time came before `after`.
        if when > after:
            yield when


def check(expr: str, tz: zoneinfo.ZoneInfo, now: dt.datetime) -> str:
    """`expr` if it is a cron expression of five fields that fires after `now`; else a 400
    naming `cron`."""
    if (not isinstance(expr, str) or not 1 <= len(expr) <= MAX_CRON_LENGTH
            or len(expr.split()) != 5 or not expr.isprintable()):
        raise InvalidInput("cron must be a cron expression of five fields (minute hour "
                           "day-of-month month day-of-week), e.g. \"30 2 * * *\".", field="cron")
    try:
        first = next(fire_times(expr, tz, now), None)
    except CronSimError as exc:
        raise InvalidInput(f"cron does not parse, or never fires ({exc}).", field="cron") from exc
    if first is None:
        raise InvalidInput("cron never fires (no fire time within 50 years).", field="cron")
    return expr


def next_after(expr: str, tz: zoneinfo.ZoneInfo, after: dt.datetime) -> dt.datetime | None:
    """The first fire time after `after`, or None (none within 50 years)."""
    return next(fire_times(expr, tz, after), None)
