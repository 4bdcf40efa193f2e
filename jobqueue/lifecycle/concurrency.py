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


def settle_keys(keys) -> None:
    """Give the free slots of these (workspace_id, key) out in the caller's transaction, or,
    for a key another transaction holds, announce it (the hubs settle it after commit)."""
    from jobqueue import wakeups

    for workspace_id, key in sorted(set(keys), key=lambda k: (str(k[0]), k[1])):
        if not backend().settle_concurrency(workspace_id, key):
            wakeups.announce(wakeups.concurrency_key(workspace_id, key))


def agent_paused(job_agent_id) -> None:
    """A paused agent cannot claim: its own queued jobs that hold a slot give it back (held
    back again) and their keys' slots go to jobs another agent can take. In the pause's
    transaction, after the agent's row: settling a key does both under its lock (the admit
    re-holds a paused agent's jobs first, passing over the rows a claim in flight holds: no
    job row is locked here, against a claim that holds its job and waits for the agent)."""
    from jobqueue import states
    from jobqueue.models import Job

    settle_keys(Job.objects.filter(
        job_agent_id=job_agent_id, label_set__isnull=True, status=states.QUEUED,
        concurrency_key__isnull=False, concurrency_held__isnull=True,
    ).values_list("workspace_id", "concurrency_key").distinct())


def agent_resumed(job_agent_id) -> None:
    """A resumed agent can claim again: the keys of its held-back jobs give their free slots
    out. In the resume's transaction."""
    from jobqueue import states
    from jobqueue.models import Job

    settle_keys(Job.objects.filter(
        job_agent_id=job_agent_id, label_set__isnull=True, status=states.QUEUED,
        concurrency_held=True).values_list("workspace_id", "concurrency_key").distinct())
