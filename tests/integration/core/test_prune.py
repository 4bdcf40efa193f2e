"""Retention: prune_jobs deletes finished jobs past their status's retention, with their
events and claims, in bounded batches, by the database's clock; never a job that is not
finished, also when requeues and claims race the pruner (threads with their own connections)."""

import io
import json
import random

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import models

from jobqueue import lifecycle, states
from jobqueue.db import NowPlusSeconds
from jobqueue.exceptions import JobNotClaimable, NotFound
from jobqueue.lifecycle import artifacts
from jobqueue.maintenance import pruner
from jobqueue.models import (
    ArtifactFileDeletion,
    Job,
    JobArtifact,
    JobClaim,
    JobEvent,
    MaintenanceRun,
)
from tests.factories import JobAgentFactory, JobFactory, claimed_job
from tests.utils import run_threads

pytestmark = pytest.mark.django_db(transaction=True)
DAY = 86400


def finished(status, days_ago, agent=None, **fields):
    """A job that really went through its lifecycle, then dated back `days_ago` days."""
    job, grant = claimed_job(**({"job_agent": agent} if agent else {}), **fields)
    if status == states.EXPIRED:
        Job.objects.filter(id=job.id).update(max_attempts=1)
        JobClaim.objects.filter(job=job).update(claim_expires_at=NowPlusSeconds(-1))
        assert lifecycle.reap_expired_claims_once(10).expired == 1
    else:
        lifecycle.report_status(job.id, grant.claim_id, status)
    Job.objects.filter(id=job.id).update(completed_at=NowPlusSeconds(-int(days_ago * DAY)))
    return job.id


def alive():
    """Old jobs that are not finished: none may ever be deleted."""
    agent = JobAgentFactory()
    queued = JobFactory(job_agent=agent)
    pending = JobFactory(job_agent=agent, pending=True)
    running, _ = claimed_job(job_agent=agent)
    old = NowPlusSeconds(-400 * DAY)
    Job.objects.filter(id__in=[queued.id, pending.id, running.id]).update(
        created_at=old, updated_at=old, available_at=old)
    return {queued.id, pending.id, running.id}


def test_default_retention_per_status_deletes_jobs_with_their_rows_and_nothing_else():
    agent = JobAgentFactory()
    gone = {finished(states.SUCCESSFUL, 15, agent), finished(states.CANCELLED, 15, agent),
            finished(states.FAILURE, 31, agent), finished(states.EXPIRED, 31, agent)}
    kept = {finished(states.SUCCESSFUL, 13, agent), finished(states.CANCELLED, 13, agent),
            finished(states.FAILURE, 15, agent), finished(states.EXPIRED, 29, agent)} | alive()
    assert JobEvent.objects.filter(job_id__in=gone).count() >= 4

    result = pruner.run_once()
    assert (result.jobs, result.by_status) == (4, {s: 1 for s in states.TERMINAL})
    assert result.retention_days == {"successful": 14, "cancelled": 14, "failure": 30,
                                     "expired": 30}
    assert set(Job.objects.values_list("id", flat=True)) == kept
    assert not JobEvent.objects.filter(job_id__in=gone).exists()
    assert JobEvent.objects.filter(job_id__in=kept).count() >= 4  # the kept jobs' endings
    assert JobClaim.objects.count() == 1  # the running job's claim
    assert pruner.run_once().jobs == 0


def test_pruning_a_job_deletes_its_artifacts_files_from_the_storage():
    agent = JobAgentFactory()
    old, grant = claimed_job(job_agent=agent)
    artifacts.upload_artifact(old.id, grant.claim_id, "out.bin", io.BytesIO(b"payload"))
    lifecycle.report_status(old.id, grant.claim_id, states.SUCCESSFUL)
    Job.objects.filter(id=old.id).update(completed_at=NowPlusSeconds(-15 * DAY))
    young, grant = claimed_job(job_agent=agent)
    artifacts.upload_artifact(young.id, grant.claim_id, "out.bin", io.BytesIO(b"kept"))
    lifecycle.report_status(young.id, grant.claim_id, states.SUCCESSFUL)
    keys = dict(JobArtifact.objects.values_list("job_id", "storage_key"))
    storage = artifacts.artifact_storage()
    assert all(storage.exists(key) for key in keys.values())
    assert pruner.run_once().jobs == 1
    assert not storage.exists(keys[old.id]) and storage.exists(keys[young.id])
    assert list(JobArtifact.objects.values_list("job_id", flat=True)) == [young.id]


def test_a_file_the_storage_fails_to_delete_is_deleted_by_the_next_clean_up(monkeypatch):
    """A storage that refuses a delete (an outage, S3's SlowDown): the pruner still tries
    every other file, its run is recorded, and the refused file's record
    (artifact_file_deletion) stays until the artifact cleaner deletes it."""
    old, grant = claimed_job()
    for name in ("one.txt", "two.txt", "three.txt"):
        artifacts.upload_artifact(old.id, grant.claim_id, name, io.BytesIO(b"payload"))
    lifecycle.report_status(old.id, grant.claim_id, states.SUCCESSFUL)
    Job.objects.filter(id=old.id).update(completed_at=NowPlusSeconds(-15 * DAY))
    keys = sorted(JobArtifact.objects.values_list("storage_key", flat=True))
    real = artifacts.artifact_storage()

    class Refusing:
        def delete(self, key):
            if key == keys[0]:
                raise OSError("503 SlowDown")
            real.delete(key)

    monkeypatch.setattr(artifacts, "artifact_storage", lambda: Refusing())
    runs = MaintenanceRun.objects.count()
    assert pruner.service_run()[0]["jobs"] == 1
    assert MaintenanceRun.objects.count() == runs + 1
    assert not Job.objects.filter(id=old.id).exists() and not JobArtifact.objects.exists()
    assert [real.exists(key) for key in keys] == [True, False, False]
    (left,) = ArtifactFileDeletion.objects.all()
    assert left.storage_key == keys[0] and str(left) == f"file {keys[0]} to delete"
    assert artifacts.clean_artifacts(10).deleted == 0  # refused again: kept for the next
    assert artifacts.clean_artifacts(10, dry_run=True).deleted == 1
    monkeypatch.undo()
    assert artifacts.clean_artifacts(10).deleted == 1
    assert not real.exists(keys[0]) and not ArtifactFileDeletion.objects.exists()


def test_a_storage_that_is_down_is_asked_a_few_times_a_run_not_for_every_file(monkeypatch):
    old, grant = claimed_job()
    for n in range(8):
        artifacts.upload_artifact(old.id, grant.claim_id, f"f{n}.txt", io.BytesIO(b"x"))
    lifecycle.report_status(old.id, grant.claim_id, states.SUCCESSFUL)
    Job.objects.filter(id=old.id).update(completed_at=NowPlusSeconds(-15 * DAY))
    asked = []

    class Down:
        def delete(self, key):
            asked.append(key)
            raise OSError("503")

    monkeypatch.setattr(artifacts, "artifact_storage", lambda: Down())
    assert pruner.run_once().jobs == 1
    assert len(asked) == artifacts.STORAGE_FAILURES_IN_A_ROW
    assert artifacts.clean_artifacts(3).deleted == 0
    assert len(asked) == 2 * artifacts.STORAGE_FAILURES_IN_A_ROW - 2  # one batch of 3: stop
    assert ArtifactFileDeletion.objects.count() == 8
    monkeypatch.undo()
    assert artifacts.clean_artifacts(3).deleted == 8 and not ArtifactFileDeletion.objects.exists()


def test_dry_run_counts_and_deletes_nothing_and_older_than_applies_to_every_status():
    agent = JobAgentFactory()
    ids = {finished(states.SUCCESSFUL, 3, agent), finished(states.FAILURE, 3, agent),
           finished(states.FAILURE, 1, agent)} | alive()
    result = pruner.run_once(older_than_days=2, dry_run=True)
    assert (result.jobs, result.by_status, result.dry_run) == (
        2, {"failure": 1, "successful": 1}, True)
    assert set(Job.objects.values_list("id", flat=True)) == ids
    assert pruner.run_once(older_than_days=2).jobs == 2
    assert Job.objects.count() == len(ids) - 2


def test_batches_are_bounded_and_max_batches_stops_early():
    agent = JobAgentFactory()
    for _ in range(5):
        finished(states.SUCCESSFUL, 20, agent)
    first = pruner.run_once(batch_size=2, max_batches=1)
    assert (first.jobs, first.batches) == (2, 1)
    rest = pruner.run_once(batch_size=2)
    assert (rest.jobs, rest.batches) == (3, 2)
    assert not Job.objects.exists()


def test_zero_days_keeps_a_status_forever(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "RETENTION_DAYS": 0, "RETENTION_FAILED_DAYS": 1}
    agent = JobAgentFactory()
    kept = finished(states.SUCCESSFUL, 900, agent)
    finished(states.FAILURE, 2, agent)
    result = pruner.run_once()
    assert result.by_status == {"failure": 1}
    assert list(Job.objects.values_list("id", flat=True)) == [kept]


def test_every_table_that_refers_to_a_job_cascades():
    # prune_finished_once empties each of them first: a relation with another on_delete
    # (SET_NULL, PROTECT) would need its own rule there.
    relations = Job._meta.related_objects
    assert {r.related_model for r in relations} >= {JobEvent, JobClaim}
    assert all(r.on_delete is models.CASCADE for r in relations)


def test_each_run_is_recorded_and_an_idle_run_extends_the_previous_idle_row():
    finished(states.SUCCESSFUL, 20)
    busy = pruner.run_once()
    idle = pruner.run_once()
    again = pruner.run_once(idle_run_id=idle.run_id)
    assert again.run_id == idle.run_id != busy.run_id
    rows = {r.id: r for r in MaintenanceRun.objects.filter(service="pruner")}
    assert rows[busy.run_id].counts == {"jobs": 1, "by_status": {"successful": 1}, "batches": 1}
    assert (rows[idle.run_id].runs, rows[idle.run_id].counts["jobs"]) == (2, 0)
    assert rows[busy.run_id].finished_at is not None and rows[busy.run_id].pid
    dry = pruner.run_once(dry_run=True, idle_run_id=idle.run_id)
    assert dry.run_id not in rows  # a dry run is its own row
    MaintenanceRun.objects.filter(id=idle.run_id).delete()  # its row is gone (pruned by hand)
    fresh = pruner.run_once(idle_run_id=idle.run_id)
    assert fresh.run_id != idle.run_id and MaintenanceRun.objects.filter(id=fresh.run_id).exists()


def test_prune_jobs_command_json_and_text(capsys):
    agent = JobAgentFactory()
    finished(states.SUCCESSFUL, 20, agent)
    finished(states.EXPIRED, 40, agent)
    call_command("prune_jobs", "--dry-run", "--json")
    out = json.loads(capsys.readouterr().out)
    assert (out["jobs"], out["dry_run"], out["by_status"]) == (
        2, True, {"expired": 1, "successful": 1})
    assert Job.objects.count() == 2
    call_command("prune_jobs", "--batch-size", "1", "--max-batches", "1")
    assert capsys.readouterr().out.startswith("deleted 1 finished job(s) (")
    call_command("prune_jobs", "--json", "--older-than", "0.5")
    out = json.loads(capsys.readouterr().out)
    assert (out["jobs"], out["dry_run"], out["batches"]) == (1, False, 1)
    call_command("prune_jobs", "--dry-run")
    assert capsys.readouterr().out.startswith("would delete 0 finished job(s) in 0 batch(es)")


@pytest.mark.parametrize("args", [["--older-than", "0"], ["--older-than", "-3"],
                                  ["--older-than", "nan"], ["--older-than", "inf"],
                                  ["--batch-size", "0"], ["--max-batches", "0"]])
def test_prune_jobs_refuses_bad_arguments_and_changes_nothing(args):
    finished(states.SUCCESSFUL, 20)
    with pytest.raises(CommandError):
        call_command("prune_jobs", *args)
    assert Job.objects.count() == 1 and not MaintenanceRun.objects.exists()


def test_a_failed_prune_is_a_clear_command_error(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("database went away")

    monkeypatch.setattr(pruner, "prune_finished_once", broken)  # the failure, not the DB layer
    finished(states.SUCCESSFUL, 20)
    with pytest.raises(CommandError, match="prune failed: RuntimeError"):
        call_command("prune_jobs")


def test_pruning_racing_requeues_and_claims_never_deletes_a_live_job():
    agent = JobAgentFactory(max_attempts=3)
    ids = [finished(states.SUCCESSFUL, 20, agent) for _ in range(120)]
    shares = [ids[0::2], ids[1::2]]
    for share in shares:
        random.shuffle(share)

    def racer(i, barrier):
        barrier.wait()
        if i == 0:
            deleted = 0
            while True:
                n = pruner.run_once(batch_size=7, record=False).jobs
                deleted += n
                if n == 0:
                    return deleted
        revived = []
        for job_id in shares[i - 1]:
            try:
                lifecycle.requeue_job(job_id, actor="operator:race")
            except NotFound:
                continue
            revived.append(job_id)
            if len(revived) % 2:
                try:
                    lifecycle.claim_job(agent, job_id)
                except JobNotClaimable:  # pragma: no cover - it was just requeued
                    raise
        return revived

    deleted, *revived = run_threads(racer, 3)
    revived = {job_id for share in revived for job_id in share}
    left = dict(Job.objects.filter(id__in=ids).values_list("id", "status"))
    assert set(left) == revived  # every revived job is still there, every other one is gone
    assert deleted == len(ids) - len(revived)
    assert set(left.values()) <= {states.QUEUED, states.IN_PROGRESS}
    for job_id in revived:  # with its whole timeline, requeue included
        kinds = list(JobEvent.objects.filter(job_id=job_id).values_list("kind", flat=True))
        assert JobEvent.REQUEUED in kinds and JobEvent.CLAIMED in kinds
    assert not JobEvent.objects.exclude(job_id__in=Job.objects.values("id")).exists()


def test_pruning_a_parent_deletes_its_edges_and_keeps_its_waiting_dependent():
    """A job's dependency edges go with it (either end); a dependent still waiting on
    another parent keeps waiting, and is released by that one alone."""
    from jobqueue.models import JobDependency

    agent = JobAgentFactory()
    old_parent = lifecycle.create_job(workspace=agent.workspace, job_agent=agent).job
    other = lifecycle.create_job(workspace=agent.workspace, job_agent=agent).job
    child = lifecycle.create_job(workspace=agent.workspace, job_agent=agent,
                                 depends_on=[old_parent.id, other.id]).job
    grant = lifecycle.claim_job(agent, old_parent.id)
    lifecycle.report_status(old_parent.id, grant.claim_id, states.SUCCESSFUL)
    Job.objects.filter(id=old_parent.id).update(completed_at=NowPlusSeconds(-15 * DAY))
    assert pruner.run_once().jobs == 1
    assert list(JobDependency.objects.values_list("parent_id", flat=True)) == [other.id]
    grant = lifecycle.claim_job(agent, other.id)
    lifecycle.report_status(other.id, grant.claim_id, states.SUCCESSFUL)
    assert Job.objects.get(id=child.id).status == states.QUEUED
