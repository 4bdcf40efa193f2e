"""Checkpoints: what an attempt saves (with a heartbeat or a progress report) for the next
attempt to resume from.

`save_checkpoint` writes job_checkpoint only while the claim is current: the guard (the
claim row, its claim_id, the caller's scope; the heartbeat's time guards are in its own
renewal, which runs first in the same transaction) is in
the statement that writes, and on PostgreSQL that statement holds the claim row FOR SHARE
until the caller's transaction ends, so a reap, release, report or operator transition ending
the claim waits for it, or it finds the claim gone and writes nothing. A row written by an
older attempt never replaces a newer attempt's (`attempt <=` in the upsert's WHERE).
`checkpoints_for` reads what claims hand out.
"""

from __future__ import annotations

import json
import uuid

from django.db import connection
from django.db.models.functions import Now

from jobqueue.models import JobCheckpoint, JobClaim

_SAVE_PG = """
INSERT INTO job_checkpoint (job_id, claim_id, attempt, data, saved_at)
SELECT c.job_id, c.claim_id, c.attempt, %(data)s::jsonb, STATEMENT_TIMESTAMP()
FROM job_claim c
WHERE c.job_id = %(job)s AND c.claim_id = %(claim)s
  AND (%(agent)s::uuid IS NULL OR c.job_agent_id = %(agent)s::uuid)
  AND (%(workspace)s::uuid IS NULL
       OR c.job_id IN (SELECT id FROM job WHERE workspace_id = %(workspace)s::uuid))
FOR SHARE OF c
ON CONFLICT (job_id) DO UPDATE SET claim_id = EXCLUDED.claim_id, attempt = EXCLUDED.attempt,
    data = EXCLUDED.data, saved_at = EXCLUDED.saved_at
  WHERE job_checkpoint.attempt <= EXCLUDED.attempt
RETURNING job_id
"""


def save_checkpoint(job_id: uuid.UUID, claim_id: uuid.UUID, data: str, *,
                    job_agent_id=None, workspace_id=None) -> bool:
    """Save `data` (JSON text) as the job's checkpoint if `claim_id` is its current claim.
    Call inside the transaction of the write it goes with. True when saved."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(_SAVE_PG, {
                "data": data, "job": job_id, "claim": claim_id, "agent": job_agent_id,
                "workspace": workspace_id,
            })
            return cursor.fetchone() is not None
    # SQLite: the caller's transaction is BEGIN IMMEDIATE, so the read and the write below
    # see and change the same state.
    claims = JobClaim.objects.filter(job_id=job_id, claim_id=claim_id)
    if job_agent_id is not None:
        claims = claims.filter(job_agent_id=job_agent_id)
    if workspace_id is not None:
        claims = claims.filter(job__workspace_id=workspace_id)
    attempt = claims.values_list("attempt", flat=True).first()
    if attempt is None:
        return False
    value = json.loads(data)
    updated = JobCheckpoint.objects.filter(job_id=job_id, attempt__lte=attempt).update(
        claim_id=claim_id, attempt=attempt, data=value, saved_at=Now()
    )
    if not updated and not JobCheckpoint.objects.filter(job_id=job_id).exists():
        JobCheckpoint.objects.create(job_id=job_id, claim_id=claim_id, attempt=attempt,
                                     data=value)
    return True


def checkpoints_for(job_ids) -> dict:
    """{job_id: the latest saved checkpoint} of those jobs that have one."""
    return dict(JobCheckpoint.objects.filter(job_id__in=list(job_ids))
                .values_list("job_id", "data"))
