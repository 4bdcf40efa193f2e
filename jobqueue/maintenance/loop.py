"""All maintenance services together: one pass runs each that is due, the loop repeats it.

Each service is a module (or an object, reaper.Sweeps) with SERVICE (its name),
interval_seconds() (its named default, from settings.JOBQUEUE) and service_run(idle_run_id=)
-> (counts, run id, idle); most also have a run_once() for their own command. A pass runs every
service that is due; a service that fails (the database is down, say) is logged, recorded
when the database lets us, and tried again after a backoff, while the others go on. Several
loops at once are safe: every service takes its rows with SKIP LOCKED (the artifact cleaner
deletes only rows that can never be published, file first). A new service joins SERVICES.

A service with OWN_THREAD = True (the webhook sender: its speed is its receivers') runs on its
own thread in the loop, with its own schedule and database connection, so that it never
delays the others (the reaper above all); one with STOPPABLE = True gets the loop's stop event
(service_run(stop=)) and ends a run in progress promptly when it is set.

`reap_claims --loop` is this loop with the one service reaper.Sweeps (own_command=True): it
reports its failures itself, as it always has (logged as "reaper sweep failed", not recorded
in maintenance_run, the first retry after two intervals).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from django.db import close_old_connections

from . import artifact_cleaner, group_watcher, pruner, reaper, run_records, schedules, webhooks

log = logging.getLogger("jobqueue.maintenance")
# The group watcher goes before the sender, so that a pass sends what it wrote; schedules go
# right after the reaper, so that a fire is as close to its time as the pass allows.
SERVICES = (reaper, schedules, group_watcher, webhooks, pruner, artifact_cleaner)
MAX_BACKOFF_SECONDS = 60.0


@dataclass
class Outcome:
    service: str
    counts: dict = field(default_factory=dict)
    run_id: int | None = None
    error: str = ""
    exception: Exception | None = field(default=None, repr=False)  # what failed, if it did

    def as_dict(self) -> dict:
        out = {"service": self.service, **self.counts, "run_id": self.run_id}
        if self.error:
            out["error"] = self.error
        return out


@dataclass
class _State:
    due_at: float = 0.0  # time.monotonic()
    idle_run_id: int | None = None
    backoff: float = 0.0


@dataclass
class Maintenance:
    """The schedule of one process: when each service is due next, and its last idle row."""

    services: tuple = SERVICES
    interval: float | None = None  # one pause for every service (--interval); else each its own
    state: dict = field(default_factory=dict)
    stop: threading.Event | None = None  # handed to STOPPABLE services
    own_command: bool = False  # one service looped by its own command (reap_claims --loop)

    def _interval(self, service) -> float:
        return self.interval if self.interval is not None else service.interval_seconds()

    def run_due(self, now: float | None = None) -> list[Outcome]:
        now = time.monotonic() if now is None else now
        outcomes = []
        for service in self.services:
            st = self.state.setdefault(service.SERVICE, _State())
            if now < st.due_at:
                continue
            outcomes.append(self._run(service, st, now))
        return outcomes

    def _run(self, service, st: _State, now: float) -> Outcome:
        close_old_connections()
        try:
            extra = {"stop": self.stop} if getattr(service, "STOPPABLE", False) else {}
            counts, run_id, idle = service.service_run(idle_run_id=st.idle_run_id, **extra)
        except Exception as exc:  # noqa: BLE001 - one failure must not end the loop
            error = f"{type(exc).__name__}: {exc}"
            interval = self._interval(service)
            if self.own_command:
                logging.getLogger(f"jobqueue.{service.SERVICE}").warning(
                    "%s sweep failed (%s); retrying", service.SERVICE, error)
                _drop_connection()
                st.backoff = st.backoff or interval
            else:
                log.warning("maintenance %s failed (%s); retrying", service.SERVICE, error)
                _drop_connection()
                _record_error(service.SERVICE, error)
            st.backoff = min(max(st.backoff * 2, interval), MAX_BACKOFF_SECONDS)
            st.due_at, st.idle_run_id = now + st.backoff, None
            return Outcome(service.SERVICE, error=error, exception=exc)
        st.backoff, st.due_at = 0.0, now + self._interval(service)
        st.idle_run_id = run_id if idle else None
        if not idle and not self.own_command:
            log.info("maintenance %s: %s", service.SERVICE, counts)
        return Outcome(service.SERVICE, counts, run_id)

    def next_due_in(self, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        due = [self.state.get(s.SERVICE, _State()).due_at for s in self.services]
        return max(0.0, min(due) - now)


def run_once(services=None) -> list[Outcome]:
    """Every service once, now."""
    return Maintenance(services=services or SERVICES).run_due()


def run_forever(*, stop: threading.Event, on_outcome, interval: float | None = None,
                services=None, own_command: bool = False) -> None:
    """Run each service when it is due until `stop` is set (which ends a pause at once): the
    OWN_THREAD services each on a thread of its own, the others on this one, in order."""
    services = services or SERVICES
    shared = tuple(s for s in services if not getattr(s, "OWN_THREAD", False))
    lock = threading.Lock()

    def report(outcome):
        with lock:  # one outcome at a time (on_outcome writes lines)
            on_outcome(outcome)

    threads = [threading.Thread(target=_lane, args=((s,), stop, report, interval, own_command),
                                name=f"maintenance-{s.SERVICE}")
               for s in services if getattr(s, "OWN_THREAD", False)]
    for thread in threads:
        thread.start()
    try:
        _lane(shared, stop, report, interval, own_command)
    finally:
        stop.set()
        for thread in threads:
            thread.join()


def _lane(services: tuple, stop: threading.Event, on_outcome, interval: float | None,
          own_command: bool = False) -> None:
    schedule = Maintenance(services=services, interval=interval, stop=stop,
                           own_command=own_command)
    try:
        while not stop.is_set():
            for outcome in schedule.run_due():
                on_outcome(outcome)
            stop.wait(schedule.next_due_in() if services else None)
    finally:
        _drop_connection()  # this thread's own


def _record_error(service: str, error: str) -> None:
    try:
        run_records.record_error(service, error)
    except Exception:  # noqa: BLE001 - the database is what failed; the log has it
        _drop_connection()


def _drop_connection():
    """Close this thread's connection, which may be broken (the next query opens one)."""
    from django.db import connection

    try:
        connection.close()
    # It is already broken: close() raises only when the driver's close() does, which
    # psycopg's and sqlite3's do not for a broken connection.
    except Exception:  # noqa: BLE001  # pragma: no cover -- a guard (above)
        connection.connection = None
