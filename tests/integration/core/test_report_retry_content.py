"""#17 item 9: only an identical repeat of a final report is a retry. The same claim_id and
status with another result or message is 409 job_finished and changes nothing, single and
batch; racing callers on PostgreSQL: exactly one content is kept."""

import pytest

from jobqueue import lifecycle, states
from jobqueue.exceptions import JobFinished
from jobqueue.models import Job, JobEvent
from tests.factories import JobAgentFactory, JobFactory, claimed_job
from tests.utils import run_threads, timeline_events

pytestmark = pytest.mark.django_db(transaction=True)


def refusals(job):
    return list(JobEvent.objects.filter(job=job, kind=JobEvent.STALE_WRITE_REFUSED)
                .values_list("detail", flat=True))


@pytest.mark.parametrize("status", [states.SUCCESSFUL, states.FAILURE, states.CANCELLED])
@pytest.mark.parametrize("change", [{"result": {"n": 2}}, {"message": "other"},
                                    {"external_id": "ext-2"}])
def test_single_retry_with_other_content_is_job_finished(status, change):
    job, grant = claimed_job()
    first = {"message": "done", "result": {"n": 1}, "external_id": "ext-1"}
    out = lifecycle.report_status(job.id, grant.claim_id, status, **first)
    again = lifecycle.report_status(job.id, grant.claim_id, status, **first)
    assert again.completed_at == out.completed_at and refusals(job) == []
    with pytest.raises(JobFinished):
        lifecycle.report_status(job.id, grant.claim_id, status, **{**first, **change})
    kept = Job.objects.get(id=job.id)
    assert (kept.status, kept.message, kept.result, kept.external_id) == (
        status, "done", {"n": 1}, "ext-1")
    assert [d["code"] for d in refusals(job)] == ["job_finished"]


def test_fields_not_given_keep_the_job_value_and_are_a_retry():
    job, grant = claimed_job()
    lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL, message="m",
                            result={"a": [1, 2]})
    # A repeat that gives fewer fields would change nothing: a retry.
    assert lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL).message == "m"
    # JSON equality, not text: the key order does not matter.
    lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL, result={"a": [1, 2]})
    with pytest.raises(JobFinished):
        lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL, result={"a": [2, 1]})


def test_batch_retry_with_other_content_is_job_finished():
    agent = JobAgentFactory()
    JobFactory.create_batch(3, job_agent=agent)
    same, other, fresh = lifecycle.claim_next_jobs(agent, 3)
    for grant in (same, other):
        lifecycle.report_status(grant.job.id, grant.claim_id, states.FAILURE, message="boom",
                                result={"exit": 3})
    out = lifecycle.report_many(agent.id, [
        lifecycle.ReportItem(same.job.id, same.claim_id, states.FAILURE, message="boom",
                             result={"exit": 3}),
        lifecycle.ReportItem(other.job.id, other.claim_id, states.FAILURE, message="boom",
                             result={"exit": 4}),
        lifecycle.ReportItem(fresh.job.id, fresh.claim_id, states.SUCCESSFUL),
    ])
    assert [(r.accepted, r.code) for r in out.results] == [
        (True, None), (False, "job_finished"), (True, None)]
    assert Job.objects.get(id=other.job.id).result == {"exit": 3}
    assert [d["code"] for d in refusals(other.job)] == ["job_finished"]
    assert refusals(same.job) == []


@pytest.mark.postgres_only
def test_racing_reports_with_different_content_keep_exactly_one():
    n = 6
    job, grant = claimed_job()

    def report(i, barrier):
        barrier.wait()
        try:
            if i % 2:
                lifecycle.report_many(job.job_agent_id, [lifecycle.ReportItem(
                    job.id, grant.claim_id, states.SUCCESSFUL, result={"i": i})])
                return "batch"
            lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL,
                                    result={"i": i})
            return "ok"
        except JobFinished:
            return "job_finished"

    results = run_threads(report, n)
    kept = Job.objects.get(id=job.id)
    assert kept.status == states.SUCCESSFUL
    winner = kept.result["i"]
    single_losers = [i for i in range(0, n, 2) if i != winner]
    assert all(results[i] == "job_finished" for i in single_losers)
    assert len(timeline_events(job.id, JobEvent.STATUS_REPORTED)) == 1
    # Every loser (single or batch) was refused and counted (one event, counted n - 1 times).
    counted = JobEvent.objects.filter(job=job, kind=JobEvent.STALE_WRITE_REFUSED)
    assert sum(counted.values_list("count", flat=True)) == n - 1
