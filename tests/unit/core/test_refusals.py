"""explain_refusal: the one decision behind every refused agent write (no database)."""

import uuid

import pytest

from jobqueue import states
from jobqueue.lifecycle.refusals import HEARTBEAT, RELEASE, STATUS, JobFacts, explain_refusal

MINE, OTHER = uuid.uuid4(), uuid.uuid4()


def facts(status, *, last=MINE, claim=MINE, expired=False):
    return JobFacts(status=status, attempt=1, last_claim_id=last, claim_id=claim,
                    lease_expired=expired)


@pytest.mark.parametrize("operation", [HEARTBEAT, STATUS, RELEASE])
def test_a_job_the_caller_cannot_see_is_not_found(operation):
    assert explain_refusal(None, operation, MINE, "successful") == "not_found"


@pytest.mark.parametrize(
    "job, operation, asked, code",
    [
        # The job ended: cancelled says so, any other end is "finished".
        (facts(states.CANCELLED, claim=None), HEARTBEAT, None, "job_cancelled"),
        (facts(states.CANCELLED, claim=None), RELEASE, None, "job_cancelled"),
        (facts(states.CANCELLED, claim=None), STATUS, "successful", "job_cancelled"),
        (facts(states.SUCCESSFUL, claim=None), HEARTBEAT, None, "job_finished"),
        (facts(states.EXPIRED, claim=None), RELEASE, None, "job_finished"),
        (facts(states.FAILURE, claim=None), STATUS, "successful", "job_finished"),
        (facts(states.FAILURE, claim=None), STATUS, "in_progress", "job_finished"),
        # A retry of the job's own final report (same claim, same status) is accepted.
        (facts(states.FAILURE, claim=None), STATUS, "failure", None),
        (facts(states.CANCELLED, claim=None), STATUS, "cancelled", None),
        # ...but not with another claim (an operator ended it, superseding this one).
        (facts(states.CANCELLED, last=None, claim=None), STATUS, "cancelled", "job_cancelled"),
        (facts(states.FAILURE, last=OTHER, claim=None), STATUS, "failure", "job_finished"),
        # Still running, another claim holds it (reaped, released, requeued, reclaimed).
        (facts(states.IN_PROGRESS, last=OTHER, claim=OTHER), HEARTBEAT, None,
         "claim_superseded"),
        (facts(states.IN_PROGRESS, last=OTHER, claim=OTHER), STATUS, "successful",
         "claim_superseded"),
        (facts(states.QUEUED, last=MINE, claim=None), RELEASE, None, "claim_superseded"),
        (facts(states.QUEUED, last=MINE, claim=None), HEARTBEAT, None, "claim_superseded"),
        # Its own lease ran out: only a heartbeat is refused for that.
        (facts(states.IN_PROGRESS, expired=True), HEARTBEAT, None, "lease_expired"),
        (facts(states.IN_PROGRESS, claim=OTHER, expired=True), HEARTBEAT, None,
         "claim_superseded"),
    ],
)
def test_decision_table(job, operation, asked, code):
    assert explain_refusal(job, operation, MINE, asked) == code
