"""Token expiry and rotation (#28 item 3, the server's part; docs/api.md "Token expiry and
rotation"): an operator's token with a lifetime, 401 `token_expired` past it, the agent's
own rotation with its overlap, the lost-answer rule and `token_already_rotated`, by the
database's clock. Every refusal changes nothing."""

import datetime as dt
import threading

import pytest
from django.db import connection
from django.utils.dateparse import parse_datetime

from agents import credentials
from agents.models import AgentToken
from jobqueue.db import NowPlusSeconds, db_now

pytestmark = pytest.mark.django_db

ROTATE = "job-agents/{}/tokens/rotate"


def _tokens():
    return sorted(AgentToken.objects.values_list("id", "revoked_at", "expires_at",
                                                 "replaced_by", "ttl_seconds"))


def _near(value, expected, slack=5):
    when = parse_datetime(value) if isinstance(value, str) else value
    return abs((when - expected).total_seconds()) <= slack


def _issue(world, **body):
    r = world.producer().post(f"job-agents/{world.agent.id}/tokens", json={"name": "t", **body})
    assert r.status_code == 201, r.content
    return r.json()


def test_an_operator_token_with_a_lifetime_expires_by_the_database_clock(world):
    issued = _issue(world, ttl_seconds=3600)
    assert _near(issued["token_expires_at"], db_now() + dt.timedelta(seconds=3600))
    agent = world.agent_caller(issued["token"])
    assert agent.get(f"job-agents/{world.agent.id}/jobs").status_code == 200
    listed = {t["id"]: t for t in world.producer().get(f"job-agents/{world.agent.id}/tokens")
              .json()["results"]}
    assert listed[issued["id"]]["expires_at"] is not None
    AgentToken.objects.filter(id=issued["id"]).update(expires_at=NowPlusSeconds(-1))
    r = agent.get(f"job-agents/{world.agent.id}/jobs")
    assert r.status_code == 401 and r.json()["code"] == "token_expired"
    assert r.headers["WWW-Authenticate"].startswith("Bearer")
    # A token without a lifetime never expires.
    assert _issue(world)["token_expires_at"] is None


@pytest.mark.parametrize("ttl", [0, -1, 365 * 24 * 3600 + 1, "60", 1.5, True])
def test_a_lifetime_out_of_bounds_is_refused_and_issues_nothing(world, ttl):
    before = _tokens()
    r = world.producer().post(f"job-agents/{world.agent.id}/tokens", json={"ttl_seconds": ttl})
    assert r.status_code == 400 and r.json()["code"] == "validation_error"
    assert list(r.json()["fields"]) == ["ttl_seconds"]
    assert _tokens() == before


def test_rotation_issues_a_successor_and_ends_the_old_token_after_the_overlap(world):
    issued = _issue(world, ttl_seconds=3600)
    old = world.agent_caller(issued["token"])
    r = old.post(ROTATE.format(world.agent.id), json={"overlap_seconds": 120})
    assert r.status_code == 201, r.content
    body = r.json()
    assert set(body) == {"id", "name", "token", "token_expires_at",
                         "previous_token_expires_at", "created_at"}
    assert body["name"] == "t" and body["token"] != issued["token"]
    now = db_now()
    assert _near(body["token_expires_at"], now + dt.timedelta(seconds=3600))  # same policy
    assert _near(body["previous_token_expires_at"], now + dt.timedelta(seconds=120))
    new = world.agent_caller(body["token"])
    assert new.get(f"job-agents/{world.agent.id}/jobs").status_code == 200
    assert old.get(f"job-agents/{world.agent.id}/jobs").status_code == 200  # the overlap
    row = AgentToken.objects.get(id=issued["id"])
    assert str(row.replaced_by_id) == body["id"]
    AgentToken.objects.filter(id=issued["id"]).update(expires_at=NowPlusSeconds(-1))
    r = old.get(f"job-agents/{world.agent.id}/jobs")
    assert r.status_code == 401 and r.json()["code"] == "token_expired"
    assert new.get(f"job-agents/{world.agent.id}/jobs").status_code == 200
    # The new token rotates in turn; a token without a lifetime passes on none.
    plain = world.agent_caller().post(ROTATE.format(world.agent.id))
    assert plain.status_code == 201 and plain.json()["token_expires_at"] is None
    assert _near(plain.json()["previous_token_expires_at"], now + dt.timedelta(seconds=300))


def test_an_overlap_of_zero_ends_the_old_token_at_once(world):
    old = world.agent_caller()
    r = old.post(ROTATE.format(world.agent.id), json={"overlap_seconds": 0})
    assert r.status_code == 201
    again = old.get(f"job-agents/{world.agent.id}/jobs")
    assert again.status_code == 401 and again.json()["code"] == "token_expired"
    assert world.agent_caller(r.json()["token"]).get(
        f"job-agents/{world.agent.id}/jobs").status_code == 200


def test_the_overlap_never_extends_an_earlier_expiry(world):
    issued = _issue(world, ttl_seconds=60)
    r = world.agent_caller(issued["token"]).post(ROTATE.format(world.agent.id),
                                                 json={"overlap_seconds": 3600})
    assert r.status_code == 201
    assert r.json()["previous_token_expires_at"] == issued["token_expires_at"]


def test_a_lost_answer_is_rotated_again_until_the_successor_is_used(world):
    issued = _issue(world, ttl_seconds=3600)
    old = world.agent_caller(issued["token"])
    first = old.post(ROTATE.format(world.agent.id), json={"overlap_seconds": 600}).json()
    # The answer was lost: the agent rotates again with the old token.
    second = old.post(ROTATE.format(world.agent.id), json={"overlap_seconds": 5}).json()
    assert second["token"] != first["token"]
    # The overlap stays the first rotation's; the unused successor is revoked.
    assert second["previous_token_expires_at"] == first["previous_token_expires_at"]
    lost = world.agent_caller(first["token"]).get(f"job-agents/{world.agent.id}/jobs")
    assert lost.status_code == 401 and lost.json()["code"] == "authentication_failed"
    assert AgentToken.objects.get(id=first["id"]).revoked_at is not None
    # Once the successor has been used, rotating the old token again is a 409.
    assert world.agent_caller(second["token"]).get(
        f"job-agents/{world.agent.id}/jobs").status_code == 200
    before = _tokens()
    r = old.post(ROTATE.format(world.agent.id))
    assert r.status_code == 409 and r.json()["code"] == "token_already_rotated"
    assert _tokens() == before
    assert second["token"] not in r.content.decode()


def test_a_successor_rotated_in_turn_counts_as_used(world):
    """Its holder had it: revoking it would leave its own successor live beside a new one."""
    token = AgentToken.objects.get(job_agent=world.agent)
    successor = credentials.rotate_agent_token(token.id, 600)[0]
    credentials.rotate_agent_token(successor.id, 600)
    assert AgentToken.objects.get(id=successor.id).last_used_at is None  # never "seen"
    before = _tokens()
    with pytest.raises(credentials.TokenAlreadyRotated):
        credentials.rotate_agent_token(token.id, 600)
    assert _tokens() == before


@pytest.mark.parametrize("overlap", [-1, 86401, "300", 1.5, None, False])
def test_an_overlap_out_of_bounds_is_refused_and_changes_nothing(world, overlap):
    before = _tokens()
    r = world.agent_caller().post(ROTATE.format(world.agent.id),
                                  json={"overlap_seconds": overlap})
    assert r.status_code == 400 and list(r.json()["fields"]) == ["overlap_seconds"]
    assert _tokens() == before


def test_only_the_agents_own_token_rotates(world):
    before = _tokens()
    # The workspace key has no token to rotate.
    r = world.producer().post(ROTATE.format(world.agent.id))
    assert r.status_code == 403 and r.json()["code"] == "permission_denied"
    # Another agent, another workspace's agent: 404.
    r = world.agent_caller().post(ROTATE.format(world.other_agent.id))
    assert r.status_code == 404
    r = world.producer().post(ROTATE.format(world.other_workspace_agent.id))
    assert r.status_code == 404
    # A revoked or an expired token: 401, each with its code.
    revoked, raw = credentials.create_agent_token(world.agent)
    credentials.revoke_agent_token(revoked)
    r = world.agent_caller(raw).post(ROTATE.format(world.agent.id))
    assert r.status_code == 401 and r.json()["code"] == "authentication_failed"
    expired, raw = credentials.create_agent_token(world.agent, ttl_seconds=60)
    AgentToken.objects.filter(id=expired.id).update(expires_at=NowPlusSeconds(-1))
    r = world.agent_caller(raw).post(ROTATE.format(world.agent.id))
    assert r.status_code == 401 and r.json()["code"] == "token_expired"
    assert len(_tokens()) == len(before) + 2  # the two made here, nothing else


def test_a_token_revoked_or_expired_after_its_authentication_does_not_rotate(world):
    token = AgentToken.objects.get(job_agent=world.agent)
    AgentToken.objects.filter(id=token.id).update(expires_at=NowPlusSeconds(-1))
    with pytest.raises(credentials.TokenNotCurrent) as caught:
        credentials.rotate_agent_token(token.id, 300)
    assert caught.value.expired is True
    AgentToken.objects.filter(id=token.id).update(expires_at=None, revoked_at=NowPlusSeconds(0))
    with pytest.raises(credentials.TokenNotCurrent) as caught:
        credentials.rotate_agent_token(token.id, 300)
    assert caught.value.expired is False


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_racing_rotations_of_one_token_leave_one_live_successor(world):
    """Eight rotations of one token at once (its answers lost, say): they run one after the
    other on the token's row lock, each revoking the unused successor before it, so exactly
    one successor stays live, and it is the one the token names."""
    token = AgentToken.objects.get(job_agent=world.agent)
    barrier = threading.Barrier(8)
    issued, errors = [], []

    def rotate():
        try:
            barrier.wait()
            issued.append(credentials.rotate_agent_token(token.id, 300)[0].id)
        except Exception as exc:  # noqa: BLE001 - the test reports any
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=rotate) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(issued) == 8
    live = list(AgentToken.objects.filter(id__in=issued, revoked_at__isnull=True)
                .values_list("id", flat=True))
    assert len(live) == 1
    assert AgentToken.objects.get(id=token.id).replaced_by_id == live[0]
