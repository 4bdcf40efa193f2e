"""Lifecycle notifications for metrics and logs, kept out of the lifecycle's own logic.

`emit(kind, **data)` is called after a transition commits (or a write is refused). It sends
the Django signal `transition` (sender: the kind), robustly: a receiver that raises is logged
by Django ("django.dispatch") and never breaks a claim. Listeners (the Prometheus metrics, for
one) subscribe at startup with `subscribe(listener)`, called as `listener(kind, **data)`;
receivers may also connect to `transition` directly. A listener must be fast. Data never
carries dispatch_context, results or tokens.

Kinds: claimed(job_agent_id, count), heartbeat(job_agent_id[, count]), progress(job_agent_id),
reported(job_agent_id, status[, count]), released(job_agent_id), refused(operation, code),
reaped(requeued, expired), cancelled(), requeued(), created(job_agent_id),
agent_paused(job_agent_id), agent_resumed(job_agent_id); from the edge:
throttle_cache_failed(error).
"""

import functools

from django.dispatch import Signal

transition = Signal()


def emit(kind: str, **data) -> None:
    transition.send_robust(sender=kind, **data)


def _uid(listener) -> str:
    # A bound method is a new object at each access: key it by its object and function.
    owner, func = getattr(listener, "__self__", None), getattr(listener, "__func__", listener)
    return f"jobqueue.observe:{id(owner)}:{id(func)}"


def subscribe(listener) -> None:
    """Call `listener(kind, **data)` on every emit (once, however often subscribed)."""

    @functools.wraps(listener)  # Django's log of a failure names the listener
    def receiver(signal, sender, **data):
        listener(sender, **data)

    transition.connect(receiver, weak=False, dispatch_uid=_uid(listener))


def unsubscribe(listener) -> None:
    transition.disconnect(dispatch_uid=_uid(listener))
