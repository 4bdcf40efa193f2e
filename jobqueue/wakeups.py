"""Wake-ups for held waits: a claim waiting for a job, a producer waiting for a job's end.

Sending: a transition that makes a job claimable (created, dispatched, released, reaped,
requeued) calls `announce(agent_key(job_agent_id), delay=...)`; one that ends a job calls
`announce(job_key(job_id))`. On PostgreSQL that is `pg_notify` on the transition's own
connection: inside its transaction NOTIFY is delivered on commit, and never on a rollback.
(The report statements, the hot path, notify only for jobs a producer's wait marked:
job.watched, jobqueue/sql/postgresql.sql.) The backend of the connection sends it
(jobqueue/lifecycle/backends.py: `notify`) and picks the listener (`listener`).
On SQLite it appends one line to the database's wake file (`<database>.wake`) after commit.

Receiving: one Hub per process, with one thread (never one per waiter):

- PostgreSQL: LISTEN on a dedicated psycopg connection outside Django's pool
  (JOBQUEUE_LISTEN_DATABASE_URL, default the database Django uses), reconnecting with
  backoff; every (re)connect wakes every waiter (a NOTIFY may have been sent while nobody
  listened).
- SQLite: the thread reads the wake file's new lines every JOBQUEUE_WAKE_FILE_POLL_SECONDS.

The same thread keeps a timer per delayed wake-up (a job whose available_at is `delay`
seconds after the transition: the delay is the database's, measured from the NOTIFY) and,
while anyone waits, re-checks every JOBQUEUE_WAIT_RECHECK_SECONDS with one query for the
whole process (which waited-for agents have a claimable job, which waited-for jobs ended), so
a lost notification never strands a waiter; and every waiter re-checks once at its deadline.
The thread blocks in one poll() of its source and a socket that close() writes to, so a
notification, a timer that falls due, and a shutdown each take effect at once.
A woken waiter re-checks with one claim statement. Idle waiters cost the database nothing.
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import os
import select
import socket
import threading
import time
from collections.abc import Callable, Iterable
from urllib.parse import unquote

from django.db import DEFAULT_DB_ALIAS, close_old_connections, connections, transaction

from jobqueue import observe
from jobqueue.conf import jobqueue_settings
from jobqueue.sql import postgresql

log = logging.getLogger("jobqueue.wakeups")

CHANNEL = "jobqueue_wake"
LISTENER_NAME = "jobqueue-wakeups"  # the listener's application_name in pg_stat_activity
WAKE_FILE_ROTATE_BYTES = 256 * 1024
TIMER_MARGIN = 0.01  # a delayed wake-up fires this much after its delay
SETTLE_RETRY_SECONDS = 0.02  # a concurrency key whose lock was held: again after this (x tries)
SETTLE_TRIES = 20
RATE_RECHECK_SECONDS = 30.0  # a held rate limit key without a timer: settled by a re-check


def agent_key(job_agent_id) -> str:
    return f"a:{job_agent_id}"


def label_key(workspace_id, labels) -> str:
    """A labelled job became claimable: one waiting agent of the workspace whose labels
    include all of `labels` re-checks (no label holds "," or a space)."""
    return f"l:{workspace_id}:{','.join(labels)}"


def route_key(job) -> str:
    """The key a job that became claimable announces: its agent's, or for a labelled job its
    label set's (the matching waiters)."""
    if job.label_set_id is None:
        return agent_key(job.job_agent_id)
    return label_key(job.workspace_id, job.labels)


def concurrency_key(workspace_id, key: str) -> str:
    """A concurrency key whose free slots are to be given out (lifecycle/concurrency.py): the
    hubs settle it. % and space escaped as in a URL (a payload's space separates its delay),
    as migration 0027's jobqueue_concurrency_announce writes it."""
    return f"k:{workspace_id}:{key.replace('%', '%25').replace(' ', '%20')}"


def rate_key(workspace_id, key: str) -> str:
    """A rate limit key whose free permits are to be given out (lifecycle/ratelimits.py),
    escaped as concurrency_key, as migration 0029's jobqueue_rate_announce writes it."""
    return f"r:{workspace_id}:{key.replace('%', '%25').replace(' ', '%20')}"


def job_key(job_id) -> str:
    return f"j:{job_id}"


def every_waiter_key(job_agent_id) -> str:
    """Wakes every waiter of the agent (a resume: its queued jobs all became claimable at
    once), where its agent_key wakes one per process."""
    return f"A:{job_agent_id}"


# --- sending ------------------------------------------------------------------------------


def announce(key: str, delay: float = 0) -> None:
    announce_many([key], delay)


def announce_many(keys: Iterable[str], delay: float = 0) -> None:
    """Tell every process (this one included), once the current transaction commits, that
    `keys` changed; `delay` > 0: they change that many seconds from now."""
    payloads = [f"{key} {delay:g}" if delay else key for key in keys]
    if not payloads:
        return
    from jobqueue.lifecycle.backends import backend

    backend().notify(CHANNEL, payloads)


def wake_file(db=None) -> str:
    db = db or connections[DEFAULT_DB_ALIAS]
    return f"{db.settings_dict['NAME']}.wake"


def append_on_commit(payloads: list[str]) -> None:
    """SQLite's sending: the lines go into the wake file once the transaction commits."""
    path = wake_file()
    transaction.on_commit(lambda: _append(path, payloads))


def _append(path: str, payloads: list[str]) -> None:
    data = "".join(p + "\n" for p in payloads).encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError:  # pragma: no cover - an unwritable directory: waiters re-check anyway
        log.warning("cannot write the wake file %s", path)
        return
    try:
        if os.fstat(fd).st_size > WAKE_FILE_ROTATE_BYTES:
            os.ftruncate(fd, 0)  # readers see it shrink and wake everyone
        os.write(fd, data)  # O_APPEND: one small write lands whole
    finally:
        os.close(fd)


# --- waiting ------------------------------------------------------------------------------


class Waiter:
    __slots__ = ("key", "capped", "warm", "event", "route")

    def __init__(self, key: str, capped: bool, warm: bool, route=None):
        self.key, self.capped, self.warm = key, capped, warm
        self.event = threading.Event()
        # An agent's waiter with labels: (its workspace id as text, its labels), which the
        # label keys of that workspace wake when it matches them.
        self.route = route


class Hub:
    """This process's waiters, by key, and the one thread that wakes them."""

    def __init__(self):
        self._lock = threading.Lock()
        self._waiters: dict[str, set[Waiter]] = {}
        self._capped = 0
        self._warm = 0  # waiters keeping their database connection (WARM_WAITS)
        self._timers: list[tuple[float, str]] = []
        self._rate_rechecked: dict[str, float] = {}  # rate limit keys the re-check settled
        self._settle_tries: dict[str, int] = {}  # concurrency keys whose lock was held
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        # close() writes to it: a thread blocked reading its source returns at once
        self._interrupt_r, self._interrupt_w = socket.socketpair()
        self._interrupt_w.setblocking(False)
        self.closed = False
        self.connected = threading.Event()  # the listener is listening
        self.connects = 0  # how often it (re)connected
        self.thread_cap: int | None = None  # what the server's threads allow (gunicorn conf)

    # waiters

    def register(self, key: str, *, capped: bool = True, route=None) -> Waiter | None:
        """A new waiter for `key`, or None when this process holds as many as it may (or is
        shutting down). `route`: an agent's (workspace id, labels), for label keys."""
        with self._lock:
            if self.closed:
                return None
            full = False
            if capped:
                cap = jobqueue_settings()["MAX_WAITING_CLAIMS"]
                if self.thread_cap is not None:
                    cap = min(cap, self.thread_cap)
                full = self._capped >= cap
            if not full:
                self._capped += capped
                warm = self._warm < jobqueue_settings()["WARM_WAITS"]
                self._warm += warm
                waiter = Waiter(key, capped, warm, route)
                self._waiters.setdefault(key, set()).add(waiter)
                self._ensure_thread()
        if full:  # counted (/metrics: jobqueue_waits_at_capacity_total), outside the lock
            observe.emit("wait_at_capacity")
            return None
        return waiter

    def unregister(self, waiter: Waiter) -> None:
        with self._lock:
            group = self._waiters.get(waiter.key)
            if group is None or waiter not in group:
                return
            group.discard(waiter)
            if not group:
                del self._waiters[waiter.key]
            if waiter.capped:
                self._capped -= 1
            if waiter.warm:
                self._warm -= 1
        if waiter.event.is_set():  # a wake-up it did not use goes to the next in line
            self.wake(waiter.key)

    def waiting(self) -> int:
        with self._lock:
            return sum(len(group) for group in self._waiters.values())

    def keys(self) -> list[str]:
        with self._lock:
            return list(self._waiters)

    def wake(self, key: str) -> None:
        """An agent's key: one job became claimable, so one waiter (not yet woken) re-checks,
        one that kept its connection if there is one; a job's key: every waiter for it; a
        concurrency key's or a rate limit key's: settle it (`settle`)."""
        if key.startswith(("k:", "r:")):
            self.settle(key)
            return
        with self._lock:
            if key.startswith("l:"):
                group = self._matching(key)
            else:
                group = list(self._waiters.get(key, ()))
        if key.startswith(("a:", "l:")):
            idle = [w for w in group if not w.event.is_set()]
            group = [next((w for w in idle if w.warm), idle[0])] if idle else []
        for waiter in group:
            waiter.event.set()

    def _matching(self, key: str) -> list[Waiter]:
        """The waiters a label key names: agents of its workspace whose labels include its
        labels (the claim rule's `matches`). Under the lock."""
        from jobqueue.claimrule import matches

        workspace, _, labels = key[2:].partition(":")
        wanted = labels.split(",")
        return [w for group in self._waiters.values() for w in group
                if w.route is not None and w.route[0] == workspace
                and matches(w.route[1], wanted)]

    def settle(self, key: str) -> None:
        """A transaction freed a slot of a concurrency key ('k:<workspace>:<key>') while
        another held the key's lock, or a rate limit key's window opens ('r:...'): give the
        key's free slots or permits out now (lifecycle/concurrency.py, ratelimits.py; the
        jobs given one are announced by their route's key). While the lock is held, again
        SETTLE_RETRY_SECONDS later, at most SETTLE_TRIES times (the reaper's sweep settles
        what is left)."""
        from jobqueue.lifecycle import concurrency, ratelimits

        settle_key = concurrency.settle_key if key.startswith("k:") else ratelimits.settle_key
        workspace, _, name = key[2:].partition(":")
        try:
            settled = settle_key(workspace, unquote(name))
        except Exception:  # the database is away: the reaper's sweep settles it
            log.warning("settling key %s failed", key, exc_info=True)
            settled = True
        finally:
            close_old_connections()
        with self._lock:
            tries = self._settle_tries.pop(key, 0) + 1
            if not settled and tries < SETTLE_TRIES:
                self._settle_tries[key] = tries
                heapq.heappush(self._timers,
                               (time.monotonic() + SETTLE_RETRY_SECONDS * tries, key))

    def wake_key(self, key: str) -> None:
        """Every waiter for `key` (a re-check found work for them)."""
        with self._lock:
            group = list(self._waiters.get(key, ()))
        for waiter in group:
            waiter.event.set()

    def wake_all(self) -> None:
        with self._lock:
            group = [w for ws in self._waiters.values() for w in ws]
        for waiter in group:
            waiter.event.set()

    def deliver(self, payload: str) -> None:
        key, _, delay = payload.partition(" ")
        seconds = _seconds(delay)
        if seconds > 0:
            at = time.monotonic() + seconds + TIMER_MARGIN
            with self._lock:
                if key.startswith("r:") and any(
                        k == key and t <= at + TIMER_MARGIN for t, k in self._timers):
                    # A rate limit key's window: one timer a key (every hub's settle
                    # announces the next opening; one timer fires one settle here).
                    return
                heapq.heappush(self._timers, (at, key))
        elif key.startswith("A:"):
            self.wake_key(agent_key(key[2:]))
        else:
            self.wake(key)

    def close(self) -> None:
        """Stop waiting: every held wait answers now, and no new one is held."""
        with self._lock:
            self.closed = True
        self._stopping.set()
        with contextlib.suppress(OSError):  # full after many close() calls: readable anyway
            self._interrupt_w.send(b"x")
        self.wake_all()

    # the thread

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="jobqueue-wakeups",
                                            daemon=True)
            self._thread.start()

    def _fire_timers(self) -> float | None:
        """Wake the keys whose timers are due; seconds until the next one (or None)."""
        now = time.monotonic()
        due = []
        with self._lock:
            while self._timers and self._timers[0][0] <= now:
                due.append(heapq.heappop(self._timers)[1])
            following = self._timers[0][0] - now if self._timers else None
        for key in due:
            self.wake(key)
        return following

    def _run(self) -> None:
        from jobqueue.lifecycle.backends import backend

        source = backend().listener(self)
        try:
            source.run()
        finally:
            self.connected.clear()
            connections.close_all()  # the re-check's connection

    def sleep(self, seconds: float, fileno: int | None = None) -> bool:
        """Block until `fileno` is readable (True), `seconds` have passed or close() is
        called (False)."""
        poller = select.poll()  # not select(): a busy server's descriptors pass 1,024
        poller.register(self._interrupt_r, select.POLLIN)
        if fileno is not None:
            poller.register(fileno, select.POLLIN)
        ready = poller.poll(max(0.0, seconds) * 1000)
        return any(fd == fileno for fd, _ in ready)

    def join(self, timeout: float = 5) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def tick(self, last_recheck: float) -> tuple[float, float]:
        """Timers and the re-check, between two reads of the source: (when the re-check
        last ran, how long the source may block)."""
        following = self._fire_timers()
        now = time.monotonic()
        interval = jobqueue_settings()["WAIT_RECHECK_SECONDS"]
        if now >= last_recheck + interval:
            self.recheck()
            last_recheck = now
        block = last_recheck + interval - now
        if following is not None:
            block = min(block, following)
        return last_recheck, max(0.0, min(block, 1.0))

    def recheck(self) -> None:
        """One query for the whole process: wake the waiters whose wait is over; and one for
        the rate limit keys whose window no timer of this hub watches."""
        keys = self.keys()
        if not keys:
            return
        from jobqueue import claimrule, states
        from jobqueue.models import Job

        agents = [k[2:] for k in keys if k.startswith("a:")]
        jobs = [k[2:] for k in keys if k.startswith("j:")]
        try:
            ready = set()
            if agents:  # the claim rule's (a paused agent's waiters sleep on)
                ready.update(agent_key(a) for a in claimrule.agents_with_claimable_jobs(agents))
            if jobs:
                ready.update(job_key(j) for j in Job.objects.filter(
                    id__in=jobs, status__in=states.TERMINAL).values_list("id", flat=True))
        except Exception:  # the database is away: the waiters' deadlines still hold
            log.warning("wake-up re-check failed", exc_info=True)
            return
        finally:
            close_old_connections()
        for key in ready:
            self.wake_key(key)
        try:
            self._settle_unwatched_rate_keys()
        except Exception:  # the database is away: the reaper's sweep settles them
            log.warning("settling rate limit keys at the re-check failed", exc_info=True)
        finally:
            close_old_connections()

    def _settle_unwatched_rate_keys(self) -> None:
        """The rate limit keys with held-back jobs that this hub has no timer for (their
        window's announcement came before it listened, or never came): settled now, which
        gives out what their window lets through and announces them for when it next opens
        (the timer this hub keeps from then on). One query (job_rate_held_idx) when every
        key has its timer, or none is held."""
        from jobqueue.lifecycle import ratelimits
        from jobqueue.lifecycle.backends import backend

        now = time.monotonic()
        with self._lock:
            watched = {key for _, key in self._timers}
        for workspace_id, key in backend().rate_keys_held():
            name = rate_key(workspace_id, key)
            # A key settled here lately and still without a timer has nothing to wait for
            # that a timer could say (a paused agent's jobs, jobs waiting for a concurrency
            # slot): the reaper's sweep settles it, not every re-check.
            if name not in watched and now - self._rate_rechecked.get(name, -1e9) >= \
                    RATE_RECHECK_SECONDS:
                self._rate_rechecked[name] = now
                ratelimits.settle_key(workspace_id, key)


def _seconds(text: str) -> float:
    try:
        return float(text) if text else 0.0
    except ValueError:
        return 0.0


class PgListener:
    """LISTEN on a dedicated connection, reconnecting with backoff."""

    def __init__(self, hub: Hub):
        self.hub = hub

    def url(self) -> str:
        configured = jobqueue_settings().get("LISTEN_DATABASE_URL") or ""
        if configured:
            return configured
        d = connections[DEFAULT_DB_ALIAS].settings_dict
        parts = {"dbname": d["NAME"], "user": d.get("USER") or "", "password":
                 d.get("PASSWORD") or "", "host": d.get("HOST") or "", "port":
                 str(d.get("PORT") or "")}
        return " ".join(f"{k}='{v}'" for k, v in parts.items() if v)

    def run(self) -> None:
        import psycopg

        hub, backoff = self.hub, 0.1
        while not hub._stopping.is_set():
            try:
                with psycopg.connect(self.url(), autocommit=True, connect_timeout=5,
                                     application_name=LISTENER_NAME) as conn:
                    conn.execute(postgresql.wake_listen)
                    hub.connects += 1
                    hub.connected.set()
                    backoff = 0.1
                    hub.wake_all()  # anything announced while nobody listened
                    last_recheck = 0.0
                    while not hub._stopping.is_set():
                        last_recheck, block = hub.tick(last_recheck)
                        # Our own wait, not notifies(timeout=block): that one returns only
                        # when the block is over, so a delayed wake-up that arrived in it
                        # fired up to a second late and close() waited it out.
                        if hub.sleep(block, conn.fileno()):
                            for note in conn.notifies(timeout=0):  # what arrived, unblocked
                                hub.deliver(note.payload)
            except psycopg.Error:
                log.warning("wake-up listener lost its connection; reconnecting in %.1fs",
                            backoff)
            hub.connected.clear()
            hub.tick(0.0)  # timers and a re-check (which may fail) while away
            hub.sleep(backoff)
            backoff = min(backoff * 2, 5.0)


class FileListener:
    """Read the wake file's new lines (SQLite: the node's processes share it)."""

    def __init__(self, hub: Hub):
        self.hub = hub
        self.path = wake_file()

    def size(self) -> int:
        try:
            return os.stat(self.path).st_size
        except FileNotFoundError:
            return 0

    def run(self) -> None:
        hub = self.hub
        offset = self.size()
        hub.connected.set()
        hub.wake_all()
        last_recheck = 0.0
        while not hub._stopping.is_set():
            last_recheck, block = hub.tick(last_recheck)
            hub.sleep(min(block, jobqueue_settings()["WAKE_FILE_POLL_SECONDS"]))
            size = self.size()
            if size < offset:  # rotated: whatever was in between is lost; wake everyone
                offset = 0
                hub.wake_all()
            if size > offset:
                with open(self.path, "rb") as f:
                    f.seek(offset)
                    data = f.read(size - offset)
                end = data.rfind(b"\n") + 1  # a line still being written waits for the next
                offset += end
                for line in data[:end].decode(errors="replace").splitlines():
                    hub.deliver(line)


_hub: Hub | None = None
_hub_lock = threading.Lock()


def hub() -> Hub:
    global _hub
    with _hub_lock:
        if _hub is None:
            _hub = Hub()
        return _hub


def shutdown() -> None:
    """The server is stopping: held waits answer now (SIGTERM, config/gunicorn.conf.py)."""
    hub().close()


def reset() -> None:
    """Close this process's hub, wait for its thread to end (its connections closed), and
    start afresh on the next wait (tests: before their database is dropped)."""
    global _hub
    with _hub_lock:
        old, _hub = _hub, None
    if old is not None:
        old.close()
        old.join()


# --- a held wait ----------------------------------------------------------------------------


def wait_until(key: str, wait_seconds: float, check: Callable[[], object], *,
               capped: bool = True, gone: Callable[[], bool] | None = None, route=None):
    """`check()` now and, while it answers something falsy, again each time `key` is
    announced, until `wait_seconds` have passed (then once more). Returns check()'s last
    answer. Without a free wait in this process (the cap), checks once. `gone()` true (the
    client left) ends the wait at once with None. The wait's length is this server's own
    interval clock; nothing is computed from it against the database's times.
    """
    waiter = hub().register(key, capped=capped, route=route) if wait_seconds > 0 else None
    if waiter is None:
        return check()
    waited = False
    try:
        result = check()  # after register: an announcement from now on is not missed
        if result:
            return result
        waited = True
        _before_sleep(waiter)
        deadline = time.monotonic() + wait_seconds
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or hub().closed:
                break
            woken = waiter.event.wait(min(remaining, 1.0))
            if gone is not None and gone():
                return None
            if woken:
                waiter.event.clear()
                _before_check(waiter)
                result = check()
                if result:
                    return result
                _before_sleep(waiter)
        _before_check(waiter)
        return check()
    finally:
        hub().unregister(waiter)
        if waited:
            # Close now, not when the request ends: a burst of wake-ups would otherwise hold
            # a connection per answered wait until its answer is written.
            _before_sleep(waiter)


def _before_sleep(waiter: Waiter) -> None:
    """A held wait keeps no database connection (outside a transaction): hundreds of waits
    would otherwise hold hundreds of idle server connections. The first WARM_WAITS of a
    process keep theirs, and a wake-up goes to them first: a new connection and the first
    run of the claim statement on it (its plan) cost ~6 ms against ~0.8 ms on a kept one,
    paid by every process a notification wakes."""
    db = connections[DEFAULT_DB_ALIAS]
    if not waiter.warm and not db.in_atomic_block:
        db.close()


def _before_check(waiter: Waiter) -> None:
    """A kept connection may have died while it idled (a database or pooler restart): check
    it with one round trip and let the check open a new one if so."""
    db = connections[DEFAULT_DB_ALIAS]
    if waiter.warm and db.connection is not None and not db.in_atomic_block \
            and not db.is_usable():
        db.close()
