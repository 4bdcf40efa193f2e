"""Concurrency keys (docs/api.md, "Concurrency keys"): giving a key's free slots out.

The triggers of migration 0027 give a key's free slots to its held jobs in the transaction
that freed them, when they can take the key's lock at once; otherwise that transaction
announces the key ('k:<workspace>:<key>'), and this module settles it afterwards: the
wake-up hub for an announced key (jobqueue.wakeups), the reaper's sweep for every key with
held jobs (a key whose announcement no hub heard). On SQLite there is nothing to settle (its
triggers always give the slots out at once).
"""

from __future__ import annotations

from django.db import transaction

from jobqueue.lifecycle.backends import backend


def settle_key(workspace_id, key: str) -> bool:
    """Give the key's free slots out now, in a transaction of its own: False when another
    transaction holds the key's lock (it gives them out itself, or announces the key)."""
    with transaction.atomic():
        return backend().settle_concurrency(workspace_id, key)


def settle_held_keys() -> int:
    """Settle every key with held jobs; how many were settled (a key whose lock another
    transaction held is left to it)."""
    return sum(settle_key(workspace_id, key)
               for workspace_id, key in backend().concurrency_keys_held())
