"""Rate limits (docs/api.md, "Rate limits"): a workspace's limits by key, and giving a key's
free permits out.

A job with `rate_limit_key` is claimed only while fewer than the key's `count` of its jobs
were claimed in the last `period_seconds` (the database's clock; a job counts by its latest
claim). The triggers of migration 0029 give permits to held-back jobs in the transaction that
changed a job of the key, when they can take the key's lock at once; otherwise that
transaction announces the key ('r:<workspace>:<key>'), and this module settles it afterwards:
the wake-up hub for an announced key (at once, or when its window opens: the admission
announces the key for then), the reaper's sweep for every key with held jobs (a key whose
announcement no hub heard), and a change of the key's limit here.
"""

from __future__ import annotations

from django.db import transaction
from django.db.models.functions import Now

from jobqueue.lifecycle.backends import backend
from jobqueue.models import RateLimit


def settle_key(workspace_id, key: str) -> bool:
    """Give the key's free permits out now, in a transaction of its own: False when another
    transaction holds the key's lock (it gives them out itself, or announces the key)."""
    with transaction.atomic():
        return backend().settle_rate(workspace_id, key)


def settle_held_keys() -> int:
    """Settle every key with held jobs; how many were settled."""
    return sum(settle_key(workspace_id, key)
               for workspace_id, key in backend().rate_keys_held())


def settle_keys(keys) -> None:
    """Give the free permits of these (workspace_id, key) out in the caller's transaction, or,
    for a key another transaction holds, announce it (the hubs settle it after commit)."""
    from jobqueue import wakeups

    for workspace_id, key in sorted(set(keys), key=lambda k: (str(k[0]), k[1])):
        if not backend().settle_rate(workspace_id, key):
            wakeups.announce(wakeups.rate_key(workspace_id, key))


def agent_paused(job_agent_id) -> None:
    """A paused agent cannot claim: its own queued jobs given a permit give it back, and the
    key's permits go to jobs another agent can take (the admission does both under the key's
    lock; in the pause's transaction, after concurrency.agent_paused)."""
    from jobqueue import states
    from jobqueue.models import Job

    settle_keys(Job.objects.filter(
        job_agent_id=job_agent_id, label_set__isnull=True, status=states.QUEUED,
        rate_limit_key__isnull=False, rate_held__isnull=True,
    ).values_list("workspace_id", "rate_limit_key").distinct())


def agent_resumed(job_agent_id) -> None:
    """A resumed agent can claim again: the keys of its held-back jobs give their free
    permits out. In the resume's transaction."""
    from jobqueue import states
    from jobqueue.models import Job

    settle_keys(Job.objects.filter(
        job_agent_id=job_agent_id, label_set__isnull=True, status=states.QUEUED,
        rate_held=True).values_list("workspace_id", "rate_limit_key").distinct())


def set_limit(workspace_id, key: str, count: int, period_seconds: int) -> RateLimit:
    """Set the key's limit (created or replaced; the caller validated it), and deal the
    key's permits again under its lock: its queued jobs give back the permits they were
    given (none was claimed: a backlog queued before a first limit, or under a higher one,
    would otherwise be claimed at once), and the permits the limit leaves free beside its
    window go out in claim order. Answers the limit as stored."""
    with transaction.atomic():
        backend().rate_take_back(workspace_id, key)
        limit, created = RateLimit.objects.get_or_create(
            workspace_id=workspace_id, key=key,
            defaults={"count": count, "period_seconds": period_seconds})
        if not created:
            RateLimit.objects.filter(id=limit.id).update(
                count=count, period_seconds=period_seconds, updated_at=Now())
        settle_keys([(workspace_id, key)])
    return RateLimit.objects.get(id=limit.id)


def get_limit(workspace_id, key: str) -> RateLimit | None:
    return RateLimit.objects.filter(workspace_id=workspace_id, key=key).first()


def delete_limit(workspace_id, key: str) -> bool:
    """Remove the key's limit: its held-back jobs are all given a permit (a key without a
    limit limits nothing). Whether there was one."""
    with transaction.atomic():
        deleted = RateLimit.objects.filter(workspace_id=workspace_id, key=key).delete()[0] > 0
        if deleted:
            settle_keys([(workspace_id, key)])
    return deleted
