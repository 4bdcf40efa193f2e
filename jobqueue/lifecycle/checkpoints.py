"""Checkpoints: what an attempt saves (with a heartbeat or a progress report) for the next
attempt to resume from.

`save_checkpoint` writes job_checkpoint only while the claim is current: the guard (the
claim row, its claim_id, the caller's scope; the heartbeat's time guards are in its own
renewal, which runs first in the same transaction) is in the statement that writes (the
backend's). On PostgreSQL (checkpoint_save_if_current) that statement holds the claim row
FOR SHARE until the caller's transaction ends, so a reap, release, report or operator
transition ending the claim waits for it, or it finds the claim gone and writes nothing; on
SQLite the caller's transaction holds the write lock. A row written by an
older attempt never replaces a newer attempt's (`attempt <=` in the upsert's WHERE).
`checkpoints_for` reads what claims hand out.
"""

from __future__ import annotations

import uuid

from jobqueue.models import JobCheckpoint

from .backends import backend


def save_checkpoint(job_id: uuid.UUID, claim_id: uuid.UUID, data: str, *,
                    job_agent_id=None, workspace_id=None) -> bool:
    """Save `data` (JSON text) as the job's checkpoint if `claim_id` is its current claim.
    Call inside the transaction of the write it goes with. True when saved."""
    return backend().save_checkpoint(job_id, claim_id, data, job_agent_id, workspace_id)


def checkpoints_for(job_ids) -> dict:
    """{job_id: the latest saved checkpoint} of those jobs that have one."""
    return dict(JobCheckpoint.objects.filter(job_id__in=list(job_ids))
                .values_list("job_id", "data"))
