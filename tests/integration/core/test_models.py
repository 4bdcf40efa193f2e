"""jobqueue/models.py's own helpers: the job queryset's active/finished halves, is_terminal,
and what each row says of itself (the admin's breadcrumbs and the shell show it)."""

import uuid

import pytest

from jobqueue import lifecycle, states
from jobqueue.models import (
    Job,
    JobArtifact,
    JobCheckpoint,
    JobClaim,
    JobEffect,
    JobEvent,
    JobLog,
    JobLogChunk,
)
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def test_active_and_finished_split_the_jobs_by_status():
    queued = JobFactory(status=states.QUEUED)
    done = JobFactory(status=states.QUEUED)
    lifecycle.cancel_job(done.id)
    done.refresh_from_db()
    assert list(Job.objects.active().filter(id__in=[queued.id, done.id])) == [queued]
    assert list(Job.objects.finished().filter(id__in=[queued.id, done.id])) == [done]
    assert done.is_terminal and not queued.is_terminal


def test_each_row_names_itself():
    job_id = uuid.UUID(int=7)
    assert str(JobClaim(job_id=job_id, attempt=2)) == f"claim on {job_id} (attempt 2)"
    assert str(JobCheckpoint(job_id=job_id, attempt=1)) == f"checkpoint of {job_id} (attempt 1)"
    assert str(JobEffect(job_id=job_id, key="mail")) == f"effect mail of {job_id}"
    assert str(JobEvent(job_id=job_id, kind="created")) == f"created on {job_id}"
    assert str(JobLog(job_id=job_id, attempt=1, length=5)) == \
        f"log of {job_id} (attempt 1, 5 bytes)"
    assert str(JobLogChunk(log_id=3, offset=0, end=5)) == "bytes 0-5 of log 3"
    assert str(JobArtifact(job_id=job_id, name="a.txt", attempt=1, state="published")) == \
        f"a.txt of {job_id} (attempt 1, published)"
