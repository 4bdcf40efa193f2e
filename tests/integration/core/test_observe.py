"""Lifecycle notifications (jobqueue.observe): listeners hear each committed transition, and a
listener that fails never breaks the transition that it was told about."""

import logging

import pytest

from jobqueue import lifecycle, observe
from jobqueue.models import Job
from tests.factories import JobAgentFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def heard():
    events = []

    def listener(kind, **data):
        events.append((kind, data))

    observe.subscribe(listener)
    observe.subscribe(listener)  # a second subscription of the same listener is a no-op
    yield events, listener
    observe.unsubscribe(listener)


def test_listeners_hear_each_transition_once_until_unsubscribed(heard):
    events, listener = heard
    agent = JobAgentFactory()
    job, _ = lifecycle.create_job(workspace=agent.workspace, job_agent=agent,
                                  job_agent_config={})
    grant = lifecycle.claim_next_job(agent)
    assert [kind for kind, _ in events] == ["created", "claimed"]
    assert events[0][1] == {"job_agent_id": agent.id}
    assert events[1][1] == {"job_agent_id": agent.id, "count": 1}

    observe.unsubscribe(listener)
    observe.unsubscribe(listener)  # unsubscribing twice is harmless
    lifecycle.release_job(job.id, grant.claim_id)
    assert [kind for kind, _ in events] == ["created", "claimed"]


def test_a_failing_listener_is_logged_and_the_transition_stands(heard, caplog):
    events, listener = heard

    def broken(kind, **data):
        raise RuntimeError("listener bug")

    observe.unsubscribe(listener)
    observe.subscribe(broken)  # first, so that the one after it must still hear
    observe.subscribe(listener)
    try:
        with caplog.at_level(logging.ERROR, logger="django.dispatch"):
            agent = JobAgentFactory()
            job, created = lifecycle.create_job(workspace=agent.workspace, job_agent=agent,
                                                job_agent_config={})
    finally:
        observe.unsubscribe(broken)
    assert created and Job.objects.filter(id=job.id).exists()
    assert [kind for kind, _ in events] == ["created"]  # the next listener still heard it
    # observe.transition is a Django signal: send_robust logs the failure, naming the listener.
    [record] = [r for r in caplog.records if r.name == "django.dispatch"]
    assert "broken" in record.getMessage() and "listener bug" in record.getMessage()
    assert record.exc_info[0] is RuntimeError
