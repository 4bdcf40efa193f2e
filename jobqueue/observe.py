"""Lifecycle notifications for metrics and logs, kept out of the lifecycle's own logic.

`emit(kind, **data)` is called after a transition commits (or a write is refused). Listeners
(the Prometheus metrics, for one) subscribe at startup. A listener must be fast and must not
raise; emit() swallows and logs what it raises so that observability never breaks a claim.
Data never carries dispatch_context, results or tokens.

Kinds: claimed(job_agent_id, count), heartbeat(job_agent_id), progress(job_agent_id),
reported(job_agent_id, status), released(job_agent_id), refused(operation, code),
reaped(requeued, expired), cancelled(), requeued(), created(job_agent_id).
"""

import logging

log = logging.getLogger("jobqueue.observe")
_listeners = []


def subscribe(listener) -> None:
    if listener not in _listeners:
        _listeners.append(listener)


def unsubscribe(listener) -> None:
    if listener in _listeners:
        _listeners.remove(listener)


def emit(kind: str, **data) -> None:
    for listener in list(_listeners):
        try:
            listener(kind, **data)
        except Exception:  # noqa: BLE001 - never let a listener break a transition
            log.exception("observer %r failed on %s", listener, kind)
