"""A job without a unique_key pays nothing for unique jobs (#30 item 1): its create sends the
statements it always did, and it never enters the key's index."""

import re

import pytest
from django.db import connection

from jobqueue import lifecycle
from jobqueue.models import Job
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


def _plain_cycle_sent(agent):
    """The statements of a plain job's create, claim and final report."""
    with statements_sent() as create:
        lifecycle.create_job(workspace=agent.workspace, job_agent=agent)
    with statements_sent() as claim:
        grant = lifecycle.claim_next_job(agent)
    with statements_sent() as report:
        lifecycle.report_status(grant.job.id, grant.claim_id, "successful", result={"ok": 1})
    return [[text for text, _ in sent] for sent in (create, claim, report)]


def test_a_plain_job_pays_nothing_for_the_debounce_cap():
    """debounce_until (0019) is written only by a debounced create: a plain job's create,
    claim and report send the statements they sent before it (5, 1 and 1 on PostgreSQL, 4, 8
    and 8 on SQLite, as measured before 0019; the PostgreSQL claim and report name it in
    their RETURNING lists, as every column), none sets it, and the plain create's INSERT
    leaves it NULL. Since 0022 a first claim on SQLite sends 7: its `claimed` event is the
    job row's (jobqueue/timeline.py), no INSERT."""
    agent = JobAgentFactory()
    create, claim, report = _plain_cycle_sent(agent)
    for texts in (claim, report):
        assert not [t for t in texts if re.search(r'SET[^;]*"?debounce_until"?\s*=', t)]
    expected = (5, 1, 1) if connection.vendor == "postgresql" else (4, 7, 8)
    assert (len(create), len(claim), len(report)) == expected, (create, claim, report)
    assert Job.objects.get().debounce_until is None
    # Only a debounced create with a max writes it, in its own INSERT (no extra statement).
    keyed = _sent(agent, unique_key="k", delay_seconds=5)
    debounced = _sent(agent, unique_key="d", debounce_seconds=5, debounce_max_seconds=5)
    assert len(debounced) == len(keyed)
    assert Job.objects.get(unique_key="d").debounce_until is not None
