"""A job without a unique_key pays nothing for unique jobs (#30 item 1): its create sends the
statements it always did, and it never enters the key's index."""

import pytest
from django.db import connection

from jobqueue import lifecycle
from tests.factories import JobAgentFactory
from tests.utils import statements_sent

pytestmark = pytest.mark.django_db


def _sent(agent, **fields):
    with statements_sent() as sent:
        lifecycle.create_job(workspace=agent.workspace, job_agent=agent, **fields)
    return [text for text, _ in sent]


def test_a_create_without_a_key_sends_nothing_about_keys():
    agent = JobAgentFactory()
    plain = _sent(agent, dispatch_context={"n": 1})
    assert not [text for text in plain if "unique" in text.replace('"unique_key"', "")]
    # No read at all (the wake-up's NOTIFY is a SELECT pg_notify on PostgreSQL).
    assert not [text for text in plain if text.lstrip().startswith("SELECT")
                and "pg_notify" not in text]
    # A keyed create is what sends them: the lock (PostgreSQL) and the lookup, then the same.
    keyed = _sent(agent, dispatch_context={"n": 1}, unique_key="nightly")
    lookups = [text for text in keyed if '"unique_key" =' in text]
    assert len(lookups) == 1
    locks = [text for text in keyed if "pg_advisory_xact_lock" in text]
    assert len(locks) == (connection.vendor == "postgresql")
    assert len(keyed) == len(plain) + len(lookups) + len(locks)


@pytest.mark.postgres_only
def test_the_keys_index_holds_keyed_jobs_only():
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'job_unique_key_idx'")
        (definition,) = cursor.fetchone()
    assert definition.endswith("WHERE (unique_key IS NOT NULL)")
