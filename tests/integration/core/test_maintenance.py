"""run_maintenance: every service once, or a loop running each when it is due; a failing
service is recorded and retried while the others go on; real processes for the loop (SIGTERM,
a database outage, two loops at once)."""

import io
import json
import signal
import subprocess
import sys
import time
from collections import Counter
from types import SimpleNamespace

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from jobqueue import lifecycle, states
from jobqueue.db import NowPlusSeconds
from jobqueue.lifecycle import artifacts
from jobqueue.maintenance import artifact_cleaner, loop, pruner
from jobqueue.maintenance import reaper as reaper_service
from jobqueue.models import Job, JobArtifact, JobClaim, JobEvent, MaintenanceRun, ReaperRun
from tests.factories import JobAgentFactory, claimed_job
from tests.netproxy import TcpProxy
from tests.utils import ROOT, spawn, subprocess_database_url, subprocess_env

pytestmark = pytest.mark.django_db(transaction=True)
DAY = 86400


def wait_for(predicate, timeout=60, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def expired_claim(agent):
    job, _ = claimed_job(job_agent=agent)
    JobClaim.objects.filter(job=job).update(claim_expires_at=NowPlusSeconds(-1))
    return job.id


def old_finished(agent):
    from jobqueue import lifecycle

    job, grant = claimed_job(job_agent=agent)
    lifecycle.report_status(job.id, grant.claim_id, states.SUCCESSFUL)
    Job.objects.filter(id=job.id).update(completed_at=NowPlusSeconds(-20 * DAY))
    return job.id


def broken_service(name="broken"):
    calls = []

    def service_run(idle_run_id=None):
        calls.append(idle_run_id)
        raise RuntimeError("service bug")

    return SimpleNamespace(SERVICE=name, interval_seconds=lambda: 2.0,
                           service_run=service_run, calls=calls)


def test_one_pass_runs_every_service_and_records_each(capsys):
    agent = JobAgentFactory()
    stuck, old = expired_claim(agent), old_finished(agent)
    call_command("run_maintenance", "--json")
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["service"] for line in lines] == ["reaper", "schedules", "group_watcher",
                                                   "webhooks", "pruner", "artifact_cleaner"]
    assert (lines[0]["requeued"], lines[4]["jobs"]) == (1, 1)
    assert Job.objects.get(id=stuck).status == states.QUEUED
    assert not Job.objects.filter(id=old).exists()
    assert ReaperRun.objects.get(id=lines[0]["run_id"]).requeued == 1
    assert MaintenanceRun.objects.get(id=lines[4]["run_id"]).counts["jobs"] == 1
    call_command("run_maintenance")
    out = capsys.readouterr().out
    assert "reaper: requeued 0, expired 0, batches 0" in out and "pruner: jobs 0" in out


def test_each_service_runs_on_its_own_interval_and_idle_runs_share_a_row(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "REAPER_INTERVAL_SECONDS": 5,
                         "PRUNE_INTERVAL_SECONDS": 300}
    schedule = loop.Maintenance(services=(reaper_service, pruner))
    assert [o.service for o in schedule.run_due(now=1000.0)] == ["reaper", "pruner"]
    assert schedule.next_due_in(now=1000.0) == 5.0
    assert [o.service for o in schedule.run_due(now=1006.0)] == ["reaper"]
    assert schedule.run_due(now=1007.0) == []
    pruned = schedule.run_due(now=1301.0)
    assert [o.service for o in pruned] == ["reaper", "pruner"]
    rows = MaintenanceRun.objects.filter(service="pruner")
    assert rows.count() == 1 and rows.get().runs == 2  # two idle runs, one row
    assert ReaperRun.objects.count() == 1 and ReaperRun.objects.get().sweeps == 3
    fixed = loop.Maintenance(interval=0.5)
    fixed.run_due(now=0.0)
    assert fixed.next_due_in(now=0.0) == 0.5


def test_a_failing_service_is_recorded_and_backs_off_while_the_others_run(caplog):
    broken = broken_service()
    agent = JobAgentFactory()
    old = old_finished(agent)
    schedule = loop.Maintenance(services=(broken, pruner))
    first = schedule.run_due(now=0.0)
    assert first[0].error == "RuntimeError: service bug" and first[0].as_dict()["error"]
    assert first[1].counts["jobs"] == 1 and not Job.objects.filter(id=old).exists()
    assert MaintenanceRun.objects.get(service="broken").error == "RuntimeError: service bug"
    assert "maintenance broken failed" in caplog.text
    assert [o.service for o in schedule.run_due(now=1.9)] == []  # backoff: its interval (2 s)
    schedule.run_due(now=2.0)  # fails again: the backoff doubles
    assert schedule.state["broken"].due_at == 6.0 and len(broken.calls) == 2
    schedule.state["broken"].backoff = 50.0
    schedule.run_due(now=6.0)
    assert schedule.state["broken"].backoff == loop.MAX_BACKOFF_SECONDS


def test_the_command_exits_non_zero_when_a_service_failed(monkeypatch, capsys):
    monkeypatch.setattr(loop, "SERVICES", (broken_service(), pruner))
    with pytest.raises(CommandError, match="maintenance failed: broken"):
        call_command("run_maintenance")
    out = capsys.readouterr().out
    assert "broken: failed: RuntimeError: service bug" in out and "pruner: jobs 0" in out


def test_an_error_that_cannot_be_recorded_is_only_logged(monkeypatch, caplog):
    def unrecordable(service, error):
        raise RuntimeError("database is down too")

    monkeypatch.setattr(loop.run_records, "record_error", unrecordable)
    outcome, = loop.Maintenance(services=(broken_service(),)).run_due(now=0.0)
    assert outcome.error and not MaintenanceRun.objects.exists()
    assert "maintenance broken failed" in caplog.text


@pytest.mark.parametrize("interval", ["0", "-1", "nan", "inf"])
def test_run_maintenance_refuses_a_bad_interval(interval):
    with pytest.raises(CommandError, match="--interval"):
        call_command("run_maintenance", "--loop", "--interval", interval)
    assert not ReaperRun.objects.exists() and not MaintenanceRun.objects.exists()


def test_reap_claims_loop_reports_its_own_failures_as_it_always_has(caplog):
    """reap_claims --loop is the maintenance loop with the reaper alone (own_command): a
    failed sweep is logged as "reaper sweep failed", not recorded in maintenance_run, and
    retried after two intervals, then four, up to the cap; a success resets the backoff."""
    service = broken_service("reaper")
    schedule = loop.Maintenance(services=(service,), interval=2.0, own_command=True)
    outcome, = schedule.run_due(now=0.0)
    assert isinstance(outcome.exception, RuntimeError) and outcome.error.startswith("Runtime")
    assert schedule.next_due_in(now=0.0) == 4.0
    schedule.run_due(now=4.0)
    assert schedule.next_due_in(now=4.0) == 8.0
    assert not MaintenanceRun.objects.exists()
    assert "reaper sweep failed (RuntimeError: service bug); retrying" in caplog.text
    assert "maintenance reaper failed" not in caplog.text


def test_reaper_sweeps_keep_the_commands_options_and_its_last_result():
    agent = JobAgentFactory()
    expired_claim(agent)
    sweeps = reaper_service.Sweeps(batch_size=1, max_batches=1)
    outcome, = loop.Maintenance(services=(sweeps,), own_command=True).run_due()
    assert outcome.counts == {"requeued": 1, "expired": 0, "batches": 1}
    assert sweeps.last.run_id == outcome.run_id and sweeps.last.requeued == 1


def test_reaper_service_run_once_is_the_reapers_sweep():
    agent = JobAgentFactory()
    expired_claim(agent)
    assert reaper_service.run_once(dry_run=True, record=False).requeued == 1
    assert reaper_service.run_once().requeued == 1


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    return proc.returncode, out, err


def start_loop(*extra, env=None):
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "run_maintenance", "--loop", *extra], cwd=ROOT,
        env=env or subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert "maintenance looping" in proc.stderr.readline()  # after its SIGTERM handler
    return proc


def test_two_loops_at_once_reap_and_prune_everything_once_and_stop_on_sigterm():
    agent = JobAgentFactory(max_attempts=5)
    stuck = [expired_claim(agent) for _ in range(30)]
    old = [old_finished(agent) for _ in range(30)]
    procs = [start_loop("--interval", "0.2", "--json") for _ in range(2)]
    try:
        wait_for(lambda: not Job.objects.filter(id__in=old).exists(), what="pruned")
        wait_for(lambda: Job.objects.filter(id__in=stuck, status=states.QUEUED).count() == 30,
                 what="reaped")
    finally:
        results = [stop(p) for p in procs]
    for code, out, err in results:
        assert code == 0, err
        assert "maintenance stopped" in err and "failed" not in err
        assert all(json.loads(line)["service"] in {"reaper", "schedules", "group_watcher",
                                                   "webhooks", "pruner", "artifact_cleaner"}
                   for line in out.splitlines())
    reaped = Counter(JobEvent.objects.filter(kind=JobEvent.REAPED, job_id__in=stuck)
                     .values_list("job_id", flat=True))
    assert reaped == {job_id: 1 for job_id in stuck}  # each once, whichever loop took it


@pytest.mark.postgres_only
def test_the_loop_rides_out_a_database_outage():
    s = connection.settings_dict
    proxy = TcpProxy(s.get("HOST") or "127.0.0.1", int(s.get("PORT") or 5432)).start()
    url = subprocess_database_url().replace(f":{s.get('PORT') or 5432}/", f":{proxy.port}/")
    proc = start_loop("--interval", "0.2",
                      env=subprocess_env(DATABASE_URL=url, DATABASE_CONNECT_TIMEOUT="2"))
    agent = JobAgentFactory(max_attempts=5)
    try:
        first = old_finished(agent)
        wait_for(lambda: not Job.objects.filter(id=first).exists(), what="prune 1")
        proxy.stop()  # the database "goes away" for the loop
        second, stuck = old_finished(agent), expired_claim(agent)
        time.sleep(2.5)  # several runs fail meanwhile
        assert Job.objects.filter(id=second).exists()
        assert proc.poll() is None, "the maintenance loop died during the outage"
        proxy = TcpProxy(proxy.target[0], proxy.target[1], listen_port=proxy.port).start()
        wait_for(lambda: not Job.objects.filter(id=second).exists(), timeout=90,
                 what="prune after the outage")
        wait_for(lambda: Job.objects.get(id=stuck).status == states.QUEUED, what="reap")
    finally:
        code, out, err = stop(proc)
        proxy.stop()
    assert code == 0, err
    assert "failed, will retry" in err and "maintenance stopped" in err
    assert "pruner: jobs 1" in out
    assert MaintenanceRun.objects.filter(service="pruner", error="").exists()


def test_spawned_one_pass_exits_zero():
    proc = spawn("manage.py", "run_maintenance", "--json")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert [json.loads(line)["service"] for line in out.splitlines()] == [
        "reaper", "schedules", "group_watcher", "webhooks", "pruner", "artifact_cleaner"]


def test_send_webhooks_command(capsys):
    call_command("send_webhooks", "--json")
    assert json.loads(capsys.readouterr().out) == {"delivered": 0, "retrying": 0, "failed": 0,
                                                   "stale": 0, "deferred": 0}
    call_command("send_webhooks", "--limit", "5")
    assert capsys.readouterr().out.strip() == (
        "delivered 0, retrying 0, failed 0, stale 0, deferred 0")
    with pytest.raises(CommandError, match="--limit"):
        call_command("send_webhooks", "--limit", "0")


def test_the_artifact_cleaner_is_a_service_that_deletes_what_can_never_be_published():
    job, grant = claimed_job()
    artifacts.upload_artifact(job.id, grant.claim_id, "half.bin", io.BytesIO(b"abandoned"))
    key = JobArtifact.objects.get(job_id=job.id).storage_key
    storage = artifacts.artifact_storage()
    assert storage.exists(key)
    schedule = loop.Maintenance(services=(artifact_cleaner,))
    (kept,) = schedule.run_due(now=0.0)  # the attempt still holds its claim: nothing to do
    assert (kept.service, kept.counts) == ("artifact_cleaner", {"deleted": 0, "batches": 0})
    lifecycle.release_job(job.id, grant.claim_id)  # the attempt ends without success
    (cleaned,) = schedule.run_due(now=301.0)
    assert cleaned.counts == {"deleted": 1, "batches": 1} and not cleaned.error
    assert not JobArtifact.objects.exists() and not storage.exists(key)
    run = MaintenanceRun.objects.get(id=cleaned.run_id)
    assert (run.service, run.counts["deleted"]) == ("artifact_cleaner", 1)


def test_an_idle_sweep_makes_a_new_row_when_its_last_one_reaped_or_is_gone():
    first = reaper_service.sweep()
    assert reaper_service.sweep(idle_run_id=first.run_id).run_id == first.run_id  # extended
    ReaperRun.objects.filter(id=first.run_id).update(requeued=1)  # not idle any more
    second = reaper_service.sweep(idle_run_id=first.run_id)
    assert second.run_id not in (None, first.run_id)
    ReaperRun.objects.filter(id=second.run_id).delete()  # pruned meanwhile
    third = reaper_service.sweep(idle_run_id=second.run_id)
    assert third.run_id not in (None, second.run_id)
    assert ReaperRun.objects.get(id=first.run_id).sweeps == 2
