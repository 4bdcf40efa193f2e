"""Log appends under racing callers (real threads, each with its own connection): appends to
one attempt's log are serialized by its row lock, so racing repeats of one chunk store it
once, racing agents appending at the end lose nothing, and an append racing the cancel that
ends its claim is kept (the grace period) but never publishes."""

import pytest

from jobqueue import lifecycle, states
from jobqueue.exceptions import LogRangeGap
from jobqueue.lifecycle import logs
from jobqueue.models import Job, JobLog, JobLogChunk
from tests.factories import claimed_job
from tests.utils import run_threads

pytestmark = pytest.mark.django_db(transaction=True)


def test_racing_repeats_of_one_chunk_store_it_once():
    job, grant = claimed_job()

    def worker(i, barrier):
        barrier.wait()
        return logs.append_log(job.id, grant.claim_id, b"0123456789", start=0).length

    assert run_threads(worker, 8) == [10] * 8
    assert JobLogChunk.objects.filter(log__job=job).count() == 1
    assert logs.read_log(job.id).data == b"0123456789"


def test_racing_appends_at_the_end_lose_nothing_and_never_overlap():
    job, grant = claimed_job()

    def worker(i, barrier):
        barrier.wait()
        for n in range(10):
            logs.append_log(job.id, grant.claim_id, f"[{i}:{n}]".encode())

    run_threads(worker, 6)
    data = logs.read_log(job.id).data.decode()
    assert sorted(data.split("]")[:-1]) == sorted(f"[{i}:{n}" for i in range(6) for n in range(10))
    log = JobLog.objects.get(job=job)
    chunks = list(JobLogChunk.objects.filter(log=log).order_by("offset"))
    assert [c.offset for c in chunks[1:]] == [c.end for c in chunks[:-1]]  # contiguous
    assert chunks[-1].end == log.length == len(data)


def test_racing_starts_past_the_end_are_refused_with_the_length():
    job, grant = claimed_job()
    logs.append_log(job.id, grant.claim_id, b"abc")

    def worker(i, barrier):
        barrier.wait()
        try:
            return logs.append_log(job.id, grant.claim_id, b"x", start=3 + i).length
        except LogRangeGap as exc:
            return ("gap", exc.length)

    results = run_threads(worker, 4)
    assert results[0] == 4  # start 3 is the end, whoever went first
    # Each other start i+3 was either the end when it ran (appended) or past it (refused with
    # the length then, shorter than its start); the appended ones are a prefix 0..k-1.
    done = [i for i, r in enumerate(results) if r == 4 + i]
    assert done == list(range(len(done)))
    assert all(r[0] == "gap" and 3 <= r[1] < 3 + i
               for i, r in enumerate(results) if i not in done)
    assert logs.read_log(job.id).data == b"abc" + b"x" * len(done)


def test_an_append_racing_the_cancel_is_kept_and_the_job_stays_cancelled():
    for _ in range(10):
        job, grant = claimed_job()

        def worker(i, barrier, job=job, grant=grant):
            barrier.wait()
            if i == 0:
                return lifecycle.cancel_job(job.id).status
            return logs.append_log(job.id, grant.claim_id, b"bye\n").length

        assert run_threads(worker, 2) == [states.CANCELLED, 4]
        assert Job.objects.get(id=job.id).status == states.CANCELLED
        assert logs.read_log(job.id).data == b"bye\n"
