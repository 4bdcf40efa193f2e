"""The PostgreSQL fast paths are prepared once per connection; a migration that adds a
column to `job` while API servers run must not break their claims and reports."""

import psycopg
import pytest
from django.db import connection

from jobqueue import lifecycle, states
from tests.factories import JobAgentFactory, JobFactory
from tests.utils import subprocess_database_url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres_only]


def test_prepared_claim_and_report_survive_a_new_column_on_job():
    agent = JobAgentFactory()
    for _ in range(4):
        JobFactory(job_agent=agent)
    # Prepared on this connection by now.
    for _ in range(2):
        grant = lifecycle.claim_next_job(agent)
        lifecycle.report_status(grant.job.id, grant.claim_id, states.SUCCESSFUL)
    pid = connection.connection.info.backend_pid
    with psycopg.connect(subprocess_database_url(), autocommit=True) as other:
        other.execute("ALTER TABLE job ADD COLUMN added_by_a_migration integer")
    try:
        grant = lifecycle.claim_next_job(agent)
        done = lifecycle.report_status(grant.job.id, grant.claim_id, states.SUCCESSFUL)
        assert done.status == states.SUCCESSFUL
        assert connection.connection.info.backend_pid == pid  # the same, prepared connection
    finally:
        with psycopg.connect(subprocess_database_url(), autocommit=True) as other:
            other.execute("ALTER TABLE job DROP COLUMN added_by_a_migration")
