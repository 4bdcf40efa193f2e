"""Fencing tokens on every claim answer (claim by id, claim-next, a batch, a held claim-next,
the idempotent replay of a keyed claim-next): each verifies offline against the served key
set, and its payload is the answer's own claim (exp: the lease's end the database gave)."""

import datetime as dt
import math
import uuid

import pytest
from jobqueue_client import FencingTokenError, verify_fencing_token
from jobqueue_client.client import parse_time
from jobqueue_client.fenced_store import FencedStore, StaleAttempt

from jobqueue import lifecycle
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def jwks(world):
    r = world.anonymous().get("/v1/.well-known/jwks.json")
    assert r.status_code == 200
    return r.json()


def check(world, answer, *, replay=False) -> dict:
    """The answer's token verifies, and says what the answer says (iat: the claim's time,
    which a replay's server_time is later than)."""
    job, claim = answer["job"], answer["claim"]
    claims = verify_fencing_token(claim["fencing_token"], jwks(world),
                                  workspace_id=str(world.workspace.id))
    assert claims.job_id == job["id"] and claims.workspace_id == str(world.workspace.id)
    assert claims.attempt == claim["attempt"] == job["attempt"]
    assert claims.claim_id == claim["claim_id"]
    expires = parse_time(claim["claim_expires_at"])
    assert claims.expires_at.timestamp() == math.floor(expires.timestamp())
    answered = math.floor(parse_time(claim["server_time"]).timestamp())
    if replay:
        assert claims.issued_at.timestamp() <= answered
    else:
        assert claims.issued_at.timestamp() == answered
    assert claims.expires_at <= expires
    return claim


def agent_post(world, path, body=None, headers=None):
    caller = world.agent_caller()
    if headers:
        caller = caller.with_headers({**caller.headers, **headers})
    return caller.post(f"job-agents/{world.agent.id}/{path}", json=body)


def test_claim_by_id_carries_a_verifiable_token(world):
    job = JobFactory(job_agent=world.agent)
    r = agent_post(world, f"jobs/{job.id}/claim")
    assert r.status_code == 200
    check(world, r.json())


def test_claim_by_id_with_expected_attempt_too(world):
    job = JobFactory(job_agent=world.agent)
    r = agent_post(world, f"jobs/{job.id}/claim", {"expected_attempt": 0, "holder": "h:1"})
    assert r.status_code == 200
    assert check(world, r.json())["attempt"] == 1


def test_claim_next_carries_a_verifiable_token(world):
    JobFactory(job_agent=world.agent)
    r = agent_post(world, "jobs/claim")
    assert r.status_code == 200
    check(world, r.json())


def test_each_claim_of_a_batch_carries_its_own_token(world):
    for _ in range(3):
        JobFactory(job_agent=world.agent)
    r = agent_post(world, "jobs/claim", {"limit": 5})
    claims = r.json()["claims"]
    assert len(claims) == 3
    tokens = {check(world, answer)["fencing_token"] for answer in claims}
    assert len(tokens) == 3


def test_a_held_claim_next_carries_a_token(world):
    """wait_seconds with a job ready (the wake-up from a producer's post, across processes, is
    in test_long_poll.py: test_a_held_claim_gets_a_job_posted_by_a_producer)."""
    JobFactory(job_agent=world.agent)
    r = agent_post(world, "jobs/claim", {"wait_seconds": 1})
    assert r.status_code == 200
    check(world, r.json())
    JobFactory(job_agent=world.agent)
    r = agent_post(world, "jobs/claim", {"wait_seconds": 1, "limit": 2})
    [answer] = r.json()["claims"]
    check(world, answer)


@pytest.mark.parametrize("body", [None, {"limit": 2}])
def test_the_idempotent_replay_carries_the_claims_token(world, body):
    JobFactory(job_agent=world.agent)
    JobFactory(job_agent=world.agent)
    first = agent_post(world, "jobs/claim", body, headers={"Idempotency-Key": "k-1"}).json()
    again = agent_post(world, "jobs/claim", body, headers={"Idempotency-Key": "k-1"}).json()
    firsts, agains = (first["claims"], again["claims"]) if body else ([first], [again])
    assert [a["claim"]["claim_id"] for a in agains] == [f["claim"]["claim_id"] for f in firsts]
    for f, a in zip(firsts, agains, strict=True):
        replayed = verify_fencing_token(check(world, a, replay=True)["fencing_token"],
                                        jwks(world))
        original = verify_fencing_token(f["claim"]["fencing_token"], jwks(world))
        assert (replayed.attempt, replayed.claim_id, replayed.issued_at) == (
            original.attempt, original.claim_id, original.issued_at)


def test_the_replay_after_a_heartbeat_says_the_lease_it_answers(world):
    """exp is the lease's end at the answer: a replay after a heartbeat answers the renewed
    lease, and its token says so (never the app's clock)."""
    JobFactory(job_agent=world.agent)
    first = agent_post(world, "jobs/claim", headers={"Idempotency-Key": "k-2"}).json()
    job_id, claim_id = first["job"]["id"], first["claim"]["claim_id"]
    lifecycle.heartbeat(uuid.UUID(job_id), uuid.UUID(claim_id))
    again = agent_post(world, "jobs/claim", headers={"Idempotency-Key": "k-2"}).json()
    check(world, again, replay=True)


def test_a_later_claim_of_the_job_has_a_higher_attempt_and_fences_the_earlier(world):
    job = JobFactory(job_agent=world.agent)
    first = check(world, agent_post(world, f"jobs/{job.id}/claim").json())
    lifecycle.release_job(job.id, first["claim_id"])
    second = check(world, agent_post(world, f"jobs/{job.id}/claim").json())
    assert second["attempt"] == first["attempt"] + 1
    store = FencedStore(jwks(world), workspace_id=str(world.workspace.id))
    store.write(second["fencing_token"], "out", "second")
    with pytest.raises(StaleAttempt):
        store.write(first["fencing_token"], "out", "first, late")
    assert store.read("out").value == "second"


def test_another_workspaces_verifier_refuses_the_token(world):
    job = JobFactory(job_agent=world.agent)
    claim = agent_post(world, f"jobs/{job.id}/claim").json()["claim"]
    with pytest.raises(FencingTokenError) as exc:
        verify_fencing_token(claim["fencing_token"], jwks(world),
                             workspace_id=str(world.other_workspace.id))
    assert exc.value.reason == "wrong_workspace"


def test_the_token_expires_with_the_lease_at_claim_time(world):
    job = JobFactory(job_agent=world.agent)
    claim = agent_post(world, f"jobs/{job.id}/claim").json()["claim"]
    after = parse_time(claim["claim_expires_at"]) + dt.timedelta(seconds=1)
    with pytest.raises(FencingTokenError, match="expired"):
        verify_fencing_token(claim["fencing_token"], jwks(world), now=after)


def test_a_key_that_cannot_sign_claims_nothing(world, settings, tmp_path):
    """A misconfigured key fails the claim before the job is claimed: no claim is left
    without its answer (the job stays queued for a claim once the key is mended)."""
    from jobqueue.models import JobClaim

    job = JobFactory(job_agent=world.agent)
    settings.JOBQUEUE = {**settings.JOBQUEUE, "FENCING_KEY_FILES": [str(tmp_path / "gone")]}
    caller = world.agent_caller()
    caller._client.raise_request_exception = False
    for path in (f"jobs/{job.id}/claim", "jobs/claim"):
        r = caller.post(f"job-agents/{world.agent.id}/{path}")
        assert r.status_code == 500
    assert not JobClaim.objects.exists()
