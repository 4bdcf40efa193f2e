"""Read-only reconciliation of a claim: is this claim_id still current, and if not, why.

A worker whose report's answer was lost cannot tell whether the report landed. It asks
here instead of writing again: one SELECT of the job and its claim (the database's clock
alongside), nothing written (no event, no lease extension, no refusal recorded). The answer
uses the codes a write with that claim_id would get (refusals.explain_refusal); a claim
that is gone but ended the job itself is told the job's final status (`final_status`), so a
worker can see that its own terminal report landed.
"""

from __future__ import annotations

import uuid

from django.db.models.functions import Now

from jobqueue import states
from jobqueue.exceptions import NotFound

from .records import seen_jobs
from .refusals import FACT_FIELDS, STATUS, JobFacts, _with_deadlines, explain_refusal
from .results import ClaimCheck


def claim_state(job_id: uuid.UUID, claim_id: uuid.UUID, *, job_agent_id=None,
                workspace_id=None) -> ClaimCheck:
    row = (
        seen_jobs(workspace_id, job_agent_id)
        .filter(id=job_id)
        .annotate(db_now=Now())
        .values(*FACT_FIELDS, "claim__attempt")
        .first()
    )
    if row is None:
        raise NotFound("No such job.")
    now, expires = row["db_now"], row["claim__claim_expires_at"]
    facts = JobFacts.from_row(row)
    # Whether a clock ended this claim's attempt (read-only: the live deadline, or the
    # reaper's timed_out event for a claim that is gone).
    facts = _with_deadlines({job_id: facts}, [(job_id, claim_id)]).get(job_id, facts)
    if row["claim__claim_id"] == claim_id and not facts.deadline_passed:
        return ClaimCheck(current=True, server_time=now, attempt=row["claim__attempt"],
                          claim_expires_at=expires,
                          lease_state="expired" if expires <= now else "active")
    ended_here = row["status"] in states.TERMINAL and row["last_claim_id"] == claim_id
    return ClaimCheck(current=False, server_time=now,
                      code=explain_refusal(facts, STATUS, claim_id),
                      final_status=row["status"] if ended_here else None)
