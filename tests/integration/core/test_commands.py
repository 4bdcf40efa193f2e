"""The management commands, run as real processes where exit codes and signals matter."""

import json
import signal
import subprocess
import sys
import time

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from jobqueue import lifecycle, states
from jobqueue.db import NowPlusSeconds
from jobqueue.models import Job, JobAgent, JobClaim, ReaperRun, Workspace
from tests.factories import JobAgentFactory, claimed_job
from tests.utils import ROOT, spawn, subprocess_env

pytestmark = pytest.mark.django_db(transaction=True)


def test_create_workspace_and_job_agent_print_ids(capsys):
    call_command("create_workspace", "acme", "--json")
    out = json.loads(capsys.readouterr().out)
    ws = Workspace.objects.get(id=out["workspace_id"])
    assert ws.name == "acme"
    call_command("create_job_agent", "--workspace", str(ws.id), "builder",
                 "--lease-seconds", "30", "--max-attempts", "4", "--max-runtime-seconds",
                 "600", "--json")
    out = json.loads(capsys.readouterr().out)
    agent = JobAgent.objects.get(id=out["job_agent_id"])
    assert (agent.name, agent.lease_seconds, agent.max_attempts, agent.max_runtime_seconds) \
        == ("builder", 30, 4, 600)
    assert agent.workspace_id == ws.id


def command_parser(name: str):
    from django.core.management import load_command_class

    return load_command_class(
        "agents" if name == "create_job_agent" else "jobqueue", name
    ).create_parser("manage.py", name)


def command_help(name: str) -> str:
    return " ".join(command_parser(name).format_help().split())


def test_every_option_of_create_job_agent_has_help():
    helps = {a.dest: a.help or "" for a in command_parser("create_job_agent")._actions}
    for dest, words in [("lease_seconds", "how long a dead agent's job waits"),
                        ("max_attempts", "claims a job of this agent may use"),
                        ("max_runtime_seconds", "longest one attempt"),
                        ("name", "name"), ("workspace", "workspace id")]:
        assert words in helps[dest], dest


def test_run_maintenance_help_names_every_service():
    from jobqueue.maintenance.loop import SERVICES

    said = {"reaper": "the reaper", "schedules": "the schedules",
            "group_watcher": "the group watcher",
            "webhooks": "the webhook sender", "pruner": "the pruner",
            "artifact_cleaner": "the artifact cleaner"}
    assert set(said) == {service.SERVICE for service in SERVICES}
    text = command_help("run_maintenance")
    for words in said.values():
        assert words in text


@pytest.mark.parametrize(
    "args",
    [
        ["--workspace", "nope", "x"],
        ["--workspace", "00000000-0000-0000-0000-000000000000", "x"],
        ["--lease-seconds", "1", "x"],
        ["--max-attempts", "0", "x"],
        ["--max-runtime-seconds", "0", "x"],
        ["--label", "no spaces", "x"],
        ["--label", "a" * 64, "x"],
        ["x", *[arg for i in range(33) for arg in ("--label", f"l{i}")]],
    ],
)
def test_create_job_agent_rejects_bad_input(args):
    ws = Workspace.objects.create(name="w")
    if "--workspace" not in args:
        args = ["--workspace", str(ws.id), *args]
    with pytest.raises(CommandError):
        call_command("create_job_agent", *args)
    assert JobAgent.objects.count() == 0


def test_reap_claims_once_json_and_dry_run(capsys):
    job, _ = claimed_job()
    JobClaim.objects.filter(job=job).update(claim_expires_at=NowPlusSeconds(-1))
    call_command("reap_claims", "--dry-run", "--json")
    assert json.loads(capsys.readouterr().out) | {"duration_seconds": 0} == {
        "requeued": 1, "expired": 0, "batches": 0, "dry_run": True,
        "run_id": ReaperRun.objects.get().id, "duration_seconds": 0,
    }
    assert Job.objects.get(id=job.id).status == states.IN_PROGRESS
    call_command("reap_claims", "--batch-size", "10")
    assert "requeued 1, expired 0" in capsys.readouterr().out
    assert Job.objects.get(id=job.id).status == states.QUEUED


def test_reap_claims_rejects_bad_options():
    for args in (["--batch-size", "0"], ["--max-batches", "0"], ["--loop", "--dry-run"],
                 ["--loop", "--interval", "0"]):
        with pytest.raises(CommandError):
            call_command("reap_claims", *args)


def test_reap_claims_fails_with_clear_message_when_database_is_unreachable():
    env = subprocess_env(
        DATABASE_URL="postgres://nobody@127.0.0.1:1/none", DATABASE_CONNECT_TIMEOUT="2"
    )
    proc = subprocess.run(
        [sys.executable, "manage.py", "reap_claims"], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode != 0
    assert "reap failed" in proc.stderr and "Traceback" not in proc.stderr


def test_reap_claims_loop_reaps_and_stops_gracefully_on_sigterm():
    agent = JobAgentFactory(max_attempts=1)
    job, _ = claimed_job(job_agent=agent)
    JobClaim.objects.filter(job=job).update(claim_expires_at=NowPlusSeconds(-1))
    proc = spawn("manage.py", "reap_claims", "--loop", "--interval", "0.2", "--json")
    try:
        deadline = time.monotonic() + 60
        while Job.objects.get(id=job.id).status != states.EXPIRED:
            assert time.monotonic() < deadline, "the loop did not reap"
            time.sleep(0.1)
        # A lease that expires while the loop runs is reaped on a later pass.
        job2, _ = claimed_job(job_agent=agent)
        JobClaim.objects.filter(job=job2).update(claim_expires_at=NowPlusSeconds(-1))
        while Job.objects.get(id=job2.id).status != states.EXPIRED:
            assert time.monotonic() < deadline, "the loop stopped reaping"
            time.sleep(0.1)
        time.sleep(1.5)  # idle sweeps, every 0.2 s
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "reaper stopped" in err
    lines = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert sum(line["expired"] for line in lines) == 2
    assert ReaperRun.objects.filter(expired=1).count() == 2
    # Idle sweeps extend one row per idle stretch instead of adding a row each.
    idle = ReaperRun.objects.filter(requeued=0, expired=0)
    assert idle.count() <= 3
    assert max(run.sweeps for run in idle) >= 3
    last = ReaperRun.objects.order_by("-started_at").first()
    assert last.finished_at > last.started_at and last.sweeps >= 3
    assert lifecycle.count_expired_claims() == {"would_requeue": 0, "would_expire": 0}


def test_reap_claims_loop_stops_at_once_on_sigterm_between_sweeps():
    """The pause between sweeps is a threading.Event wait: a signal ends it at once, not at
    the next poll (nor after the 60 s interval)."""
    proc = spawn("manage.py", "reap_claims", "--loop", "--interval", "60")
    try:
        assert "reaper looping every 60.0s" in proc.stderr.readline()
        time.sleep(1.0)  # the first sweep is done: the loop waits for the next one
        stopped_at = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        waited = time.monotonic() - stopped_at
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "reaper stopped" in err
    assert waited < 20, waited  # far from the 60 s the loop would otherwise sleep


def test_create_workspace_prints_the_id_and_the_key_once_as_text(capsys):
    from agents import credentials

    call_command("create_workspace", "  acme  ")
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(": ")[0] for line in lines] == ["workspace_id", "api_key"]
    ws = Workspace.objects.get(id=lines[0].split(": ")[1])
    assert ws.name == "acme"  # trimmed
    key = credentials.resolve_api_key(lines[1].split(": ")[1])
    assert key is not None and key.workspace_id == ws.id


@pytest.mark.parametrize("name", ["", "   "])
def test_create_workspace_refuses_an_empty_name(name):
    with pytest.raises(CommandError, match="NAME must not be empty"):
        call_command("create_workspace", name)
    assert Workspace.objects.count() == 0


def test_create_job_agent_prints_text_with_its_token(capsys):
    from agents import credentials

    ws = Workspace.objects.create(name="w")
    call_command("create_job_agent", "--workspace", str(ws.id), "builder")
    out = dict(line.split(": ", 1) for line in capsys.readouterr().out.splitlines())
    assert set(out) == {"job_agent_id", "workspace_id", "token"}
    token = credentials.resolve_agent_token(out["token"])
    assert str(token.job_agent_id) == out["job_agent_id"] and out["workspace_id"] == str(ws.id)


def test_create_job_agent_takes_labels_as_a_set(capsys):
    ws = Workspace.objects.create(name="w")
    call_command("create_job_agent", "--workspace", str(ws.id), "--label", "linux",
                 "--label", "gpu", "--label", "linux", "--json", "x")
    assert JobAgent.objects.get(name="x").labels == ["gpu", "linux"]
