"""Artifact publication under racing callers (real threads, each with its own connection):
the successful report that publishes races the reaper and the cancel; an upload races the
cancel. Whoever wins, the job's published set is the winning claim's staged set or nothing,
and everything else is garbage that clean-up deletes."""

import io

import pytest

from jobqueue import lifecycle, states
from jobqueue.db import NowPlusSeconds
from jobqueue.exceptions import Conflict
from jobqueue.lifecycle import artifacts
from jobqueue.models import Job, JobArtifact, JobClaim
from tests.factories import claimed_job
from tests.utils import run_threads

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("own_artifact_storage")]
ROUNDS = 8


def staged_job():
    job, grant = claimed_job()
    artifacts.upload_artifact(job.id, grant.claim_id, "out.bin", io.BytesIO(b"payload"))
    return job, grant


def published(job):
    return list(JobArtifact.objects.filter(job=job, published_at__isnull=False)
                .values_list("name", "claim_id"))


def report_or_refusal(job, grant, batch=False):
    if batch:
        (outcome,) = lifecycle.report_many(job.job_agent_id, [lifecycle.ReportItem(
            job_id=job.id, claim_id=grant.claim_id, status=states.SUCCESSFUL)]).results
        return outcome.status if outcome.accepted else outcome.code
    try:
        return lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL).status
    except Conflict as exc:
        return exc.code


@pytest.mark.parametrize("batch", [False, True], ids=["single", "batch"])
@pytest.mark.parametrize("rival", ["reaper", "cancel"])
def test_the_publishing_report_races_the_reaper_and_the_cancel(rival, batch):
    for _ in range(ROUNDS):
        job, grant = staged_job()
        if rival == "reaper":
            JobClaim.objects.filter(job=job).update(claim_expires_at=NowPlusSeconds(-1))

        def worker(i, barrier, job=job, grant=grant):
            barrier.wait()
            if i == 0:
                return report_or_refusal(job, grant, batch)
            if rival == "reaper":
                return lifecycle.reap_expired_claims_once(10).reaped
            try:
                return lifecycle.cancel_job(job.id).status
            except Conflict as exc:
                return exc.code

        reported, other = run_threads(worker, 2)
        final = Job.objects.get(id=job.id).status
        if reported == states.SUCCESSFUL:
            assert final == states.SUCCESSFUL
            assert published(job) == [("out.bin", grant.claim_id)]
            assert other in (0, "job_finished")
        else:
            assert final in (states.QUEUED, states.CANCELLED)
            assert published(job) == []
            assert reported in ("claim_superseded", "job_cancelled")
    assert artifacts.clean_artifacts(100).deleted == sum(
        1 for j in Job.objects.all() if j.status != states.SUCCESSFUL)
    assert JobArtifact.objects.filter(published_at__isnull=True).count() == 0


def test_an_upload_racing_the_cancel_is_never_published_and_is_cleaned():
    for _ in range(ROUNDS):
        job, grant = claimed_job()

        def worker(i, barrier, job=job, grant=grant):
            barrier.wait()
            if i == 0:
                return lifecycle.cancel_job(job.id).status
            try:
                return artifacts.upload_artifact(job.id, grant.claim_id, "late.bin",
                                                 io.BytesIO(b"x" * 300_000)).size
            except Conflict as exc:
                return exc.code

        cancelled, uploaded = run_threads(worker, 2)
        assert cancelled == states.CANCELLED
        assert uploaded in (300_000, "job_cancelled")
        assert published(job) == []
    artifacts.clean_artifacts(3)
    assert not JobArtifact.objects.exists()
