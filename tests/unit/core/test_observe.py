"""jobqueue.observe: a Django signal; listeners keep the emit(kind, **data) shape (no database)."""

import logging

from jobqueue import observe


class Listener:
    def __init__(self):
        self.calls = []

    def on_event(self, kind, **data):
        self.calls.append((kind, data))


def test_emit_reaches_listeners_and_direct_receivers():
    listener, direct = Listener(), []

    def receiver(signal, sender, **data):
        direct.append((sender, data))

    observe.subscribe(listener.on_event)
    observe.subscribe(listener.on_event)  # once, however often subscribed
    observe.transition.connect(receiver)
    try:
        observe.emit("claimed", job_agent_id="a", count=2)
    finally:
        observe.unsubscribe(listener.on_event)
        observe.transition.disconnect(receiver)
    observe.emit("claimed", job_agent_id="a", count=3)
    assert listener.calls == [("claimed", {"job_agent_id": "a", "count": 2})]
    assert direct == [("claimed", {"job_agent_id": "a", "count": 2})]


def test_a_failing_listener_is_logged_and_breaks_nothing(caplog):
    def broken(kind, **data):
        raise RuntimeError("listener bug")

    after = Listener()
    observe.subscribe(broken)
    observe.subscribe(after.on_event)
    try:
        with caplog.at_level(logging.ERROR, logger="django.dispatch"):
            observe.emit("refused", operation="heartbeat", code="lease_expired")
    finally:
        observe.unsubscribe(broken)
        observe.unsubscribe(after.on_event)
    assert after.calls == [("refused", {"operation": "heartbeat", "code": "lease_expired"})]
    [record] = [r for r in caplog.records if r.name == "django.dispatch"]
    assert "broken" in record.getMessage() and "listener bug" in record.getMessage()
    assert record.exc_info[0] is RuntimeError
