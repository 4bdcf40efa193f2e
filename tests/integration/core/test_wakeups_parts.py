"""The parts of jobqueue.wakeups on their own: payloads, timers, one wake per notification,
the hand-over of an unused wake-up, the re-check that fails, the listener's URL, the wake
file's rotation, and the edge's hang-up check."""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid

import pytest

from agents.views.base import client_gone
from jobqueue import claimrule, wakeups
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db(transaction=True)


def test_announcing_nothing_sends_nothing(django_assert_num_queries):
    with django_assert_num_queries(0):
        wakeups.announce_many([])


def test_a_notification_for_an_agent_wakes_one_waiter_and_for_a_job_every_one():
    hub = wakeups.Hub()
    hub._ensure_thread = lambda: None  # no listener: deliver() by hand
    a, b = (hub.register("a:x") for _ in range(2))
    j1, j2 = (hub.register("j:y", capped=False) for _ in range(2))
    hub.deliver("a:x")
    assert [a.event.is_set(), b.event.is_set()].count(True) == 1
    hub.deliver("a:x")  # the second goes to the other one
    assert a.event.is_set() and b.event.is_set()
    hub.deliver("j:y")
    assert j1.event.is_set() and j2.event.is_set()
    # an unused wake-up is handed on when its waiter leaves
    c = hub.register("a:x")
    a.event.set()
    b.event.clear()
    hub.unregister(a)
    assert b.event.is_set() or c.event.is_set()
    hub.unregister(a)  # twice: nothing
    assert hub.waiting() == 4


def test_an_agent_notification_wakes_a_waiter_that_kept_its_connection_first(settings):
    hub = wakeups.Hub()
    hub._ensure_thread = lambda: None
    settings.JOBQUEUE = {**settings.JOBQUEUE, "WARM_WAITS": 0}
    cold = [hub.register("a:x") for _ in range(5)]
    settings.JOBQUEUE = {**settings.JOBQUEUE, "WARM_WAITS": 1}
    warm = hub.register("a:x")
    assert warm.warm and not any(w.warm for w in cold)
    extra = hub.register("a:x")
    assert not extra.warm  # one warm waiter a process, as configured
    cold.append(extra)
    hub.deliver("a:x")
    assert warm.event.is_set() and not any(w.event.is_set() for w in cold)
    hub.deliver("a:x")  # the warm one is already woken: a cold one next
    assert [w.event.is_set() for w in cold].count(True) == 1
    hub.unregister(warm)  # its slot is free again (its unused wake-up is handed on)
    assert hub.register("a:y").warm


def test_a_delayed_notification_fires_after_its_delay_and_a_bad_one_at_once():
    """Through the hub's own thread and listener (LISTEN, or the wake file), as a held wait
    sees it: the waiter's event is set after the delay, not before, not never, and not at the
    end of the thread's current read of its source (which may last up to a second: it once
    fired so, up to a second late on PostgreSQL)."""
    hub = wakeups.Hub()
    key = wakeups.agent_key(uuid.uuid4())  # an agent with no jobs: the re-check wakes nobody
    w = hub.register(key)  # starts the thread
    try:
        assert hub.connected.wait(30), "the listener never connected"
        assert w.event.wait(10), "a (re)connect wakes every waiter"
        w.event.clear()
        time.sleep(0.05)  # the thread's first re-check is done: its read now blocks ~1 s
        sent = time.monotonic()
        wakeups.announce(key, delay=0.3)  # committed at once (autocommit)
        assert w.event.wait(30), "the delayed wake-up never came"
        late = time.monotonic() - sent
        assert 0.3 <= late < 0.3 + 0.5  # never before its delay, not at the read's end
        w.event.clear()
        hub.deliver(f"{key} not-a-number")  # treated as no delay
        assert w.event.is_set()
    finally:
        hub.close()
        hub.join()


def test_closing_the_hub_ends_its_thread_at_once():
    """close() interrupts the thread's read of its source (tests reset the hub after each
    waiting test, and a server stopping waits for it): it once waited the read out, up to a
    second on PostgreSQL."""
    hub = wakeups.Hub()
    w = hub.register(wakeups.agent_key(uuid.uuid4()))
    assert hub.connected.wait(30), "the listener never connected"
    assert w.event.wait(10)
    time.sleep(0.05)  # the thread now blocks in a read of up to a second
    closed = time.monotonic()
    hub.close()
    hub.join(5)
    assert not hub._thread.is_alive()
    assert time.monotonic() - closed < 0.5
    hub.close()  # twice: nothing more


def test_a_failing_recheck_leaves_the_waiters_to_their_deadlines(monkeypatch, caplog):
    hub = wakeups.Hub()
    hub._ensure_thread = lambda: None
    w = hub.register("a:00000000-0000-0000-0000-000000000000")

    def broken(*a, **k):
        raise RuntimeError("database away")

    monkeypatch.setattr(claimrule, "agents_with_claimable_jobs", broken)
    hub.recheck()
    assert not w.event.is_set() and "re-check failed" in caplog.text
    hub.unregister(w)
    hub.recheck()  # nobody waits: no query at all


def test_the_recheck_wakes_the_waiters_of_an_ended_job():
    job = JobFactory(successful=True)
    hub = wakeups.Hub()
    hub._ensure_thread = lambda: None
    w = hub.register(wakeups.job_key(job.id), capped=False)
    hub.recheck()
    assert w.event.is_set()


def test_the_listener_uses_its_own_database_url_when_given(settings):
    listener = wakeups.PgListener(wakeups.Hub())
    settings.JOBQUEUE = {**settings.JOBQUEUE, "LISTEN_DATABASE_URL": "postgres://direct/db"}
    assert listener.url() == "postgres://direct/db"
    settings.JOBQUEUE = {**settings.JOBQUEUE, "LISTEN_DATABASE_URL": ""}
    assert "dbname=" in listener.url()


def test_the_wake_file_rotates_and_readers_wake_everyone(tmp_path, monkeypatch):
    path = str(tmp_path / "db.wake")
    monkeypatch.setattr(wakeups, "WAKE_FILE_ROTATE_BYTES", 10)
    wakeups._append(path, ["a:1", "a:2", "a:3"])
    assert os.path.getsize(path) == 12
    wakeups._append(path, ["a:4"])  # past the limit: starts again
    assert open(path).read() == "a:4\n"


def test_a_file_listener_reads_new_lines_and_wakes_all_after_a_rotation(tmp_path, monkeypatch):
    hub = wakeups.Hub()
    listener = wakeups.FileListener(hub)
    listener.path = str(tmp_path / "db.wake")
    assert listener.size() == 0
    hub._ensure_thread = lambda: None
    one, two = (wakeups.agent_key(uuid.uuid4()) for _ in range(2))
    w, other = hub.register(one), hub.register(two)

    t = threading.Thread(target=listener.run, daemon=True)
    t.start()
    try:
        assert w.event.wait(10) and other.event.wait(10)  # run() wakes everyone at its start
        w.event.clear()
        other.event.clear()
        wakeups._append(listener.path, [one])
        assert w.event.wait(2) and not other.event.is_set()
        w.event.clear()
        os.truncate(listener.path, 0)  # rotated under the reader
        assert w.event.wait(2) and other.event.wait(2)
    finally:
        hub.close()
        t.join(5)


class _Request:
    def __init__(self, meta):
        self.META = meta


def test_the_edge_tells_a_client_that_hung_up():
    assert client_gone(_Request({})) is None  # not gunicorn: no way to tell
    mine, theirs = socket.socketpair()
    gone = client_gone(_Request({"gunicorn.socket": mine}))
    assert gone() is False  # connected, nothing sent
    theirs.sendall(b"G")
    assert gone() is False  # a pipelined request is not a hang-up
    theirs.close()
    mine.recv(1)
    assert gone() is True
    mine.close()
    assert gone() is True  # a closed socket (OSError)
