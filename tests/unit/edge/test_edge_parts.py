"""Pieces of the HTTP edge that the API's own order of checks never lets a request reach, yet
that keep their answer should that order change: DRF asks only the first authenticator for
the WWW-Authenticate header, permissions refuse an anonymous request before a throttle sees
it, reverse() is not used on job ids."""

import gc
import uuid
from types import SimpleNamespace

import pytest
from rest_framework import serializers

from agents.authentication import KIND_AGENT_TOKEN, KIND_API_KEY, ApiKeyAuthentication, Principal
from agents.permissions import InWorkspace, WorkspaceKeyOnly
from agents.serializers import vocabulary
from agents.serializers.fields import ApiInput, StrictIntegerField
from agents.serializers.job_agents import Outcome
from agents.throttling import CredentialRateThrottle
from agents.urls import AnyId
from agents.views.base import _has_body
from jobqueue import actors
from jobqueue.models import JobAgent


def test_the_api_key_scheme_names_its_header():
    assert ApiKeyAuthentication().authenticate_header(None) == 'ApiKey header="X-API-Key"'


@pytest.mark.parametrize("permission", [InWorkspace, WorkspaceKeyOnly])
@pytest.mark.parametrize("user", [None, SimpleNamespace(is_authenticated=False, kind="x")])
def test_no_principal_is_no_permission(permission, user):
    assert permission().has_permission(SimpleNamespace(user=user), SimpleNamespace()) is False


def test_a_request_without_a_credential_is_not_throttled():
    assert CredentialRateThrottle().allow_request(SimpleNamespace(user=None), None) is True


def test_any_id_converts_back_to_its_text():
    job_id = uuid.uuid4()
    assert AnyId().to_url(job_id) == str(job_id) and AnyId().to_python("x") == "x"


@pytest.mark.parametrize(("length", "has"), [("12", True), ("0", False), (None, False),
                                             ("twelve", False)])
def test_a_body_is_there_when_its_length_says_so(length, has):
    meta = {} if length is None else {"CONTENT_LENGTH": length}
    assert _has_body(SimpleNamespace(META=meta)) is has


def test_an_outcome_shape_must_say_what_a_success_carries():
    with pytest.raises(NotImplementedError):
        Outcome().success(None)


def test_a_strict_integer_with_one_bound_keeps_drfs_message_for_it():
    field = StrictIntegerField(min_value=1)
    assert field.error_messages["min_value"] == \
        serializers.IntegerField.default_error_messages["min_value"]
    both = StrictIntegerField(min_value=1, max_value=9)
    assert both.error_messages["min_value"] == "Must be an integer from 1 to 9."


def test_the_vocabulary_walk_visits_a_shape_reached_twice_once():
    """A request shape that inherits from two others is met on both paths: counted once."""
    before = vocabulary()

    class Left(ApiInput):
        pass

    class Right(ApiInput):
        pass

    class Both(Left, Right):
        pass

    assert vocabulary() == before  # no new words: the walk met Both twice and ended
    del Left, Right, Both
    gc.collect()


def test_the_actor_of_a_principal_is_its_agent_or_its_key():
    agent = JobAgent(id=uuid.uuid4())
    workspace, credential = uuid.uuid4(), uuid.uuid4()
    as_agent = Principal(KIND_AGENT_TOKEN, workspace, credential, job_agent=agent)
    assert as_agent.actor == actors.agent_actor(agent.id) == f"agent:{agent.id}"
    as_key = Principal(KIND_API_KEY, workspace, credential)
    assert as_key.actor == actors.producer_actor(credential)
