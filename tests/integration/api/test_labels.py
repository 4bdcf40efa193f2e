"""Labelled jobs (#28 item 1; docs/api.md "Labels and routing"): a job targets one job agent
or a label set, exactly one; an agent claims its own jobs and the labelled jobs its labels
include, in one claim order (single, batch, named, long-poll), and lists them; once claimed a
labelled job is the claiming agent's; PATCH job-agents/{id} changes an agent's labels; bad
input is a 400 naming its field and changes nothing."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from agents import credentials
from jobqueue import lifecycle, states, wakeups
from jobqueue.conf import jobqueue_settings
from jobqueue.db import NowPlusSeconds
from jobqueue.models import Job, JobAgent, JobClaim, JobEvent, JobLabelSet

from .conftest import Caller

pytestmark = pytest.mark.django_db


def _agent(world, name, labels, workspace=None):
    agent = lifecycle.create_job_agent(workspace=workspace or world.workspace, name=name,
                                       labels=labels)
    caller = Caller(agent.workspace_id,
                    {"Authorization": f"Bearer {credentials.issue_agent_token(agent)}"})
    return agent, caller


def _create(world, **body):
    r = world.producer().post("jobs", json=body)
    assert r.status_code == 201, r.content
    return r.json()


def _state():
    return (sorted(Job.objects.values_list("id", "status", "job_agent_id", "updated_at")),
            JobLabelSet.objects.count(), JobClaim.objects.count())


def test_a_labelled_job_goes_to_an_agent_whose_labels_include_its_own(world):
    gpu, gpu_caller = _agent(world, "gpu-eu", ["gpu", "linux", "region=eu"])
    cpu, cpu_caller = _agent(world, "cpu", ["linux"])
    body = _create(world, labels=["linux", "gpu", "gpu"], dispatch_context={"secret": "s"})
    assert body["labels"] == ["gpu", "linux"] and body["job_agent_id"] is None
    assert body["status"] == "queued" and "dispatch_context" not in body
    # The agent without `gpu` is not handed it, nor lists it; the one with it does.
    assert cpu_caller.post(f"job-agents/{cpu.id}/jobs/claim").status_code == 204
    assert cpu_caller.get(f"job-agents/{cpu.id}/jobs").json()["results"] == []
    listed = gpu_caller.get(f"job-agents/{gpu.id}/jobs").json()["results"]
    assert [j["id"] for j in listed] == [body["id"]]
    r = gpu_caller.post(f"job-agents/{gpu.id}/jobs/claim")
    assert r.status_code == 200, r.content
    claim = r.json()
    assert claim["job"]["id"] == body["id"] and claim["job"]["dispatch_context"] == {"secret": "s"}
    # Claimed, it is the claiming agent's: job_agent_id names it, labels keep the target.
    seen = world.producer().get(f"jobs/{body['id']}").json()
    assert seen["job_agent_id"] == str(gpu.id) and seen["labels"] == ["gpu", "linux"]
    running = gpu_caller.get(f"job-agents/{gpu.id}/jobs?status=in_progress").json()["results"]
    assert [j["id"] for j in running] == [body["id"]]
    # It heartbeats and reports with its own token, as for its own jobs; the other cannot.
    url = f"jobs/{body['id']}"
    assert cpu_caller.post(f"{url}/heartbeat", json={"claim_id": claim["claim"]["claim_id"]}
                           ).status_code == 404
    assert gpu_caller.post(f"{url}/heartbeat", json={"claim_id": claim["claim"]["claim_id"]}
                           ).status_code == 200
    r = gpu_caller.put(f"{url}/status", json={"claim_id": claim["claim"]["claim_id"],
                                              "status": "successful"})
    assert r.status_code == 200, r.content
    assert Job.objects.get(id=body["id"]).status == states.SUCCESSFUL


def test_one_claim_order_over_the_agents_own_jobs_and_its_labelled_ones(world):
    agent, caller = _agent(world, "builder", ["linux", "arm64"])
    own = [lifecycle.create_job(workspace=world.workspace, job_agent=agent, priority=p).job
           for p in (0, 5)]
    labelled = [lifecycle.create_job(workspace=world.workspace, labels=labels, priority=p).job
                for labels, p in ((["linux"], 9), (["arm64", "linux"], 1), (["linux"], 0))]
    lifecycle.create_job(workspace=world.workspace, labels=["windows"], priority=99)
    lifecycle.create_job(workspace=world.workspace, job_agent=world.agent, priority=99)
    expected = [labelled[0], own[1], labelled[1], own[0], labelled[2]]
    listed = caller.get(f"job-agents/{agent.id}/jobs").json()["results"]
    assert [j["id"] for j in listed] == [str(j.id) for j in expected]
    r = caller.post(f"job-agents/{agent.id}/jobs/claim", json={"limit": 3})
    assert [c["job"]["id"] for c in r.json()["claims"]] == [str(j.id) for j in expected[:3]]
    first = caller.post(f"job-agents/{agent.id}/jobs/claim").json()
    assert first["job"]["id"] == str(expected[3].id)
    r = caller.post(f"job-agents/{agent.id}/jobs/claim", json={"limit": 10})
    assert [c["job"]["id"] for c in r.json()["claims"]] == [str(expected[4].id)]


def test_a_named_claim_of_a_labelled_job_needs_a_matching_agent(world):
    gpu, gpu_caller = _agent(world, "gpu", ["gpu"])
    cpu, cpu_caller = _agent(world, "cpu", ["cpu"])
    foreign, foreign_caller = _agent(world, "gpu-elsewhere", ["gpu"], world.other_workspace)
    job = lifecycle.create_job(workspace=world.workspace, labels=["gpu"]).job
    before = _state()
    assert cpu_caller.post(f"job-agents/{cpu.id}/jobs/{job.id}/claim").status_code == 404
    r = foreign_caller.post(f"job-agents/{foreign.id}/jobs/{job.id}/claim")
    assert r.status_code == 404
    assert _state() == before
    r = gpu_caller.post(f"job-agents/{gpu.id}/jobs/{job.id}/claim")
    assert r.status_code == 200, r.content
    # Taken: another matching agent is told it is not claimable now (409), not 404.
    other, other_caller = _agent(world, "gpu-2", ["gpu", "x"])
    r = other_caller.post(f"job-agents/{other.id}/jobs/{job.id}/claim")
    assert r.status_code == 409 and r.json()["code"] == "job_not_claimable"


def test_a_requeued_labelled_job_goes_to_any_matching_agent_again(world):
    first, first_caller = _agent(world, "first", ["gpu"])
    second, second_caller = _agent(world, "second", ["gpu"])
    job = lifecycle.create_job(workspace=world.workspace, labels=["gpu"], max_attempts=3).job
    claim = first_caller.post(f"job-agents/{first.id}/jobs/claim").json()
    r = first_caller.post(f"jobs/{job.id}/release", json={"claim_id": claim["claim"]["claim_id"]})
    assert r.status_code == 200, r.content
    seen = world.producer().get(f"jobs/{job.id}").json()
    assert seen["status"] == "queued" and seen["job_agent_id"] == str(first.id)
    # The agent that claimed it last has no hold on it: it is listed for, and claimed by,
    # whichever matching agent comes first, and it is not the first agent's own job.
    listed = second_caller.get(f"job-agents/{second.id}/jobs").json()["results"]
    assert [j["id"] for j in listed] == [str(job.id)]
    r = world.producer().request("PATCH", f"job-agents/{first.id}", {"labels": []})
    assert r.status_code == 200 and r.json()["labels"] == []
    first.refresh_from_db()
    assert first_caller.post(f"job-agents/{first.id}/jobs/claim").status_code == 204
    assert first_caller.get(f"job-agents/{first.id}/jobs").json()["results"] == []
    again = second_caller.post(f"job-agents/{second.id}/jobs/claim").json()
    assert again["job"]["id"] == str(job.id) and again["claim"]["attempt"] == 2
    events = world.producer().get(f"jobs/{job.id}").json()["events"]
    claimed = [e["actor"] for e in events if e["kind"] == "claimed"]
    assert claimed == [f"agent:{first.id}", f"agent:{second.id}"]


def test_patch_changes_an_agents_labels_and_defaults(world):
    agent, caller = _agent(world, "late", [])
    job = lifecycle.create_job(workspace=world.workspace, labels=["gpu"]).job
    assert caller.post(f"job-agents/{agent.id}/jobs/claim").status_code == 204
    producer = world.producer()
    r = producer.request("PATCH", f"job-agents/{agent.id}",
                         {"labels": ["gpu", "gpu", "linux"], "lease_seconds": 45})
    assert r.status_code == 200, r.content
    assert r.json()["labels"] == ["gpu", "linux"] and r.json()["lease_seconds"] == 45
    assert r.json()["name"] == "late"
    r = caller.post(f"job-agents/{agent.id}/jobs/claim")
    assert r.status_code == 200 and r.json()["job"]["id"] == str(job.id)
    assert r.json()["claim"]["lease_seconds"] == 45
    assert producer.request("PATCH", f"job-agents/{agent.id}", {}).status_code == 200
    assert JobAgent.objects.get(id=agent.id).labels == ["gpu", "linux"]


@pytest.mark.parametrize("body, field", [
    ({"labels": ["a b"]}, "labels"),
    ({"labels": [f"l{i}" for i in range(33)]}, "labels"),
    ({"labels": "gpu"}, "labels"),
    ({"labels": [7]}, "labels"),
    ({"lease_seconds": 0}, "lease_seconds"),
    ({"name": "renamed"}, "name"),
    ({"labels": ["x" * 64]}, "labels"),
])
def test_a_bad_patch_is_400_naming_its_field_and_changes_nothing(world, body, field):
    before = sorted(JobAgent.objects.values_list("id", "name", "labels", "lease_seconds"))
    r = world.producer().request("PATCH", f"job-agents/{world.agent.id}", body)
    assert r.status_code == 400, r.content
    assert r.json()["code"] == "validation_error" and field in r.json()["fields"]
    assert sorted(JobAgent.objects.values_list("id", "name", "labels", "lease_seconds")) == before


@pytest.mark.parametrize("body, field", [
    ({}, "job_agent_id"),
    ({"labels": ["gpu"], "job_agent_id": "AGENT"}, "job_agent_id"),
    ({"labels": []}, "labels"),
    ({"labels": [f"l{i}" for i in range(17)]}, "labels"),
    ({"labels": ["gpu", ""]}, "labels"),
    ({"labels": ["tab\there"]}, "labels"),
    ({"labels": [["gpu"]]}, "labels"),
    ({"labels": None}, "labels"),
    ({"labels": {"gpu": True}}, "labels"),
])
def test_a_job_with_both_neither_or_bad_labels_is_400_and_nothing_is_made(world, body, field):
    body = {k: (str(world.agent.id) if v == "AGENT" else v) for k, v in body.items()}
    before = _state()
    r = world.producer().post("jobs", json=body)
    assert r.status_code == 400, r.content
    assert r.json()["code"] == "validation_error" and field in r.json()["fields"], r.json()
    assert _state() == before


def test_label_sets_are_shared_per_workspace_and_replays_keep_their_target(world):
    a = _create(world, labels=["b", "a"])
    b = _create(world, labels=["a", "b", "a"])
    r = world.producer().post("jobs", json={"labels": ["a", "b"]},
                              headers={"Idempotency-Key": "k1"})
    assert r.status_code == 201
    assert JobLabelSet.objects.filter(workspace=world.workspace).count() == 1
    again = world.producer().post("jobs", json={"labels": ["b", "a"]},
                                  headers={"Idempotency-Key": "k1"})
    assert again.status_code == 200 and again.json()["id"] == r.json()["id"]
    other = world.producer().post("jobs", json={"labels": ["a"]},
                                  headers={"Idempotency-Key": "k1"})
    assert other.status_code == 422
    r = Caller(world.other_workspace.id, {"X-API-Key": world.other_key}).post(
        "jobs", json={"labels": ["a", "b"]})
    assert r.status_code == 201
    assert JobLabelSet.objects.count() == 2 and a["labels"] == b["labels"] == ["a", "b"]


def test_a_unique_key_replace_never_crosses_targets(world):
    first = _create(world, labels=["gpu"], unique_key="nightly")
    r = world.producer().post("jobs", json={"job_agent_id": str(world.agent.id),
                                            "unique_key": "nightly", "on_conflict": "replace"})
    assert r.status_code == 409 and r.json()["code"] == "unique_key_conflict"
    r = world.producer().post("jobs", json={"labels": ["gpu"], "unique_key": "nightly",
                                            "on_conflict": "replace", "priority": 7})
    assert r.status_code == 200 and r.json()["id"] == first["id"] and r.json()["priority"] == 7


def test_a_labelled_job_takes_the_services_defaults(world):
    JobAgent.objects.filter(id=world.agent.id).update(max_attempts=9, max_runtime_seconds=60)
    job = Job.objects.get(id=_create(world, labels=["gpu"])["id"])
    assert job.max_attempts == jobqueue_settings()["DEFAULT_MAX_ATTEMPTS"] != 9
    assert job.max_runtime_seconds is None and job.job_agent_id is None


@pytest.mark.usefixtures("wakeups_stopped_after")
@pytest.mark.django_db(transaction=True)
def test_a_labelled_job_wakes_the_matching_waiter_only(world):
    gpu, gpu_caller = _agent(world, "gpu", ["gpu", "linux"])
    cpu, cpu_caller = _agent(world, "cpu", ["linux"])
    checks = {gpu.id: 0, cpu.id: 0}
    real = lifecycle.claim._claim

    def counted(job_agent, *args, **kwargs):
        checks[job_agent.id] = checks.get(job_agent.id, 0) + 1
        return real(job_agent, *args, **kwargs)

    lifecycle.claim._claim = counted
    answers = {}

    def wait(agent, caller):
        started = time.monotonic()
        r = caller.post(f"job-agents/{agent.id}/jobs/claim", json={"wait_seconds": 4})
        answers[agent.id] = (r.status_code, time.monotonic() - started,
                             r.json() if r.status_code == 200 else None)

    try:
        threads = [threading.Thread(target=wait, args=a)
                   for a in ((gpu, gpu_caller), (cpu, cpu_caller))]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 5
        while wakeups.hub().waiting() < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        before = dict(checks)
        job = lifecycle.create_job(workspace=world.workspace, labels=["gpu"]).job
        for t in threads:
            t.join(10)
    finally:
        lifecycle.claim._claim = real
    status, took, body = answers[gpu.id]
    assert status == 200 and body["job"]["id"] == str(job.id) and took < 3
    assert answers[cpu.id][0] == 204
    # The waiter that does not match was not woken by the job: it checked only at its
    # deadline (and on the hub's periodic re-checks, which find nothing for it).
    assert checks[cpu.id] - before[cpu.id] <= 1 + 4 // 2


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_racing_agents_claim_each_labelled_job_once(live_world):
    world = live_world
    agents = [_agent(world, f"racer-{i}", ["gpu", f"n{i}"]) for i in range(6)]
    jobs = {str(lifecycle.create_job(workspace=world.workspace, labels=["gpu"]).job.id)
            for _ in range(40)}
    own = {str(lifecycle.create_job(workspace=world.workspace, job_agent=agents[0][0]).job.id)
           for _ in range(5)}
    callers = [Caller(a.workspace_id, c.headers, world.base_url) for a, c in agents]
    barrier = threading.Barrier(len(agents))
    taken: list[list[str]] = [[] for _ in agents]

    def race(i):
        agent = agents[i][0]
        barrier.wait()
        while True:
            r = callers[i].post(f"job-agents/{agent.id}/jobs/claim", json={"limit": 3})
            got = [c["job"]["id"] for c in r.json()["claims"]]
            if not got:
                return
            taken[i].extend(got)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(len(agents))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    everything = [j for got in taken for j in got]
    assert len(everything) == len(set(everything)) == len(jobs) + len(own)
    assert set(everything) == jobs | own
    assert own <= set(taken[0])  # its own jobs went to it alone
    assert JobClaim.objects.count() == len(everything)
    assert not Job.objects.filter(available_at__gt=NowPlusSeconds(1)).exists()


def test_a_flow_mixes_labelled_jobs_and_jobs_of_an_agent(world):
    gpu, gpu_caller = _agent(world, "gpu", ["gpu"])
    r = world.producer().post("flows", json={"jobs": [
        {"ref": "extract", "job_agent_id": str(world.agent.id)},
        {"ref": "train", "labels": ["gpu"], "depends_on_refs": ["extract"]},
        {"ref": "publish", "labels": ["gpu"], "depends_on_refs": ["train"]},
    ]})
    assert r.status_code == 201, r.content
    jobs = r.json()["jobs"]
    assert jobs["train"]["labels"] == ["gpu"] and jobs["train"]["job_agent_id"] is None
    assert jobs["train"]["status"] == "pending"
    assert JobLabelSet.objects.filter(workspace=world.workspace).count() == 1
    grant = lifecycle.claim_next_job(world.agent)
    lifecycle.report_status(grant.job.id, grant.claim_id, states.SUCCESSFUL)
    # The parent's success queues the labelled child, for the matching agent.
    claim = gpu_caller.post(f"job-agents/{gpu.id}/jobs/claim").json()
    assert claim["job"]["id"] == jobs["train"]["id"]
    assert claim["claim"]["parents"][0]["job_id"] == jobs["extract"]["id"]


@pytest.mark.parametrize("item, field", [
    ({"ref": "a"}, "0: job_agent_id"),
    ({"ref": "a", "labels": ["gpu"], "job_agent_id": "AGENT"}, "0: job_agent_id"),
    ({"ref": "a", "labels": []}, "0: labels"),
    ({"ref": "a", "labels": ["no spaces"]}, "0: labels"),
])
def test_a_bad_flow_target_is_400_and_nothing_is_made(world, item, field):
    item = {k: (str(world.agent.id) if v == "AGENT" else v) for k, v in item.items()}
    before = _state()
    r = world.producer().post("flows", json={"jobs": [item]})
    assert r.status_code == 400, r.content
    assert r.json()["fields"]["jobs"][0].startswith(field), r.json()
    assert _state() == before


def test_a_schedule_of_labelled_jobs(world):
    from jobqueue.lifecycle import schedules

    gpu, gpu_caller = _agent(world, "gpu", ["gpu"])
    producer = world.producer()
    r = producer.post("schedules", json={"name": "nightly", "cron": "0 3 * * *",
                                         "job": {"labels": ["gpu"], "priority": 3}})
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["job"]["job_agent_id"] is None and body["job"]["labels"] == ["gpu"]
    fired = schedules.trigger_schedule(body["id"], workspace_id=world.workspace.id)
    claim = gpu_caller.post(f"job-agents/{gpu.id}/jobs/claim").json()
    assert claim["job"]["id"] == str(fired.job.id) and claim["job"]["priority"] == 3
    # Changed to target an agent, then refused with both or neither.
    r = producer.request("PATCH", f"schedules/{body['id']}",
                         {"job": {"job_agent_id": str(world.agent.id)}})
    assert r.status_code == 200 and r.json()["job"]["job_agent_id"] == str(world.agent.id)
    assert "labels" not in r.json()["job"]
    for job in ({}, {"labels": ["gpu"], "job_agent_id": str(world.agent.id)},
                {"labels": ["a b"]}):
        r = producer.request("PATCH", f"schedules/{body['id']}", {"job": job})
        assert r.status_code == 400, (job, r.content)
    with pytest.raises(Exception, match="exactly one"):
        schedules.create_schedule(workspace=world.workspace, name="x", cron_expr="0 3 * * *",
                                  job_agent=world.agent, job={"labels": ["gpu"]})


@pytest.mark.parametrize("write", ["heartbeat", "status", "effect", "claim_check"])
def test_a_stale_claim_of_a_labelled_job_another_agent_took_is_409(world, write):
    """As for an agent's own job: its stale claim is told the claim is superseded (409), not
    that the job is gone, once another matching agent claimed the job."""
    a, a_caller = _agent(world, "a", ["gpu"])
    b, b_caller = _agent(world, "b", ["gpu", "linux"])
    job = lifecycle.create_job(workspace=world.workspace, labels=["gpu"]).job
    stale = a_caller.post(f"job-agents/{a.id}/jobs/claim").json()["claim"]["claim_id"]
    lifecycle.requeue_job(job.id, workspace_id=world.workspace.id)
    assert b_caller.post(f"job-agents/{b.id}/jobs/claim").json()["job"]["id"] == str(job.id)
    url = f"jobs/{job.id}"
    if write == "heartbeat":
        r = a_caller.post(f"{url}/heartbeat", json={"claim_id": stale})
    elif write == "status":
        r = a_caller.put(f"{url}/status", json={"claim_id": stale, "status": "successful"})
    elif write == "effect":
        r = a_caller.post(f"{url}/effects/charge/begin", json={"claim_id": stale})
    else:
        r = a_caller.get(f"{url}/claims/{stale}")
        assert r.status_code == 200 and r.json()["current"] is False, r.content
        assert r.json()["code"] == "claim_superseded"
        return
    assert r.status_code == 409 and r.json()["code"] == "claim_superseded", r.content
    # An agent that does not match the job is told nothing of it.
    c, c_caller = _agent(world, "c", ["cpu"])
    assert c_caller.post(f"{url}/heartbeat", json={"claim_id": stale}).status_code == 404


@pytest.mark.usefixtures("wakeups_stopped_after")
@pytest.mark.django_db(transaction=True)
def test_a_paused_agent_waits_without_taking_a_labelled_jobs_wake_up(world):
    paused, paused_caller = _agent(world, "paused", ["gpu"])
    running, running_caller = _agent(world, "running", ["gpu"])
    lifecycle.pause_job_agent(paused, "operator:test")
    answers = {}

    def wait(agent, caller):
        r = caller.post(f"job-agents/{agent.id}/jobs/claim", json={"wait_seconds": 3})
        answers[agent.name] = (r.status_code, time.monotonic())

    threads = [threading.Thread(target=wait, args=a)
               for a in ((paused, paused_caller), (running, running_caller))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 5
    while wakeups.hub().waiting() < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    routes = [w.route for group in wakeups.hub()._waiters.values() for w in group]
    assert sorted(r is None for r in routes) == [False, True]  # the paused one has none
    created = time.monotonic()
    lifecycle.create_job(workspace=world.workspace, labels=["gpu"])
    for t in threads:
        t.join(10)
    assert answers["running"][0] == 200 and answers["running"][1] - created < 1.5
    assert answers["paused"][0] == 204


def test_the_holder_of_a_labelled_job_another_agent_claimed_since_may_append_in_the_grace_period(
        world):
    # docs/outputs.md: a claim that ended may append its last lines for LOG_GRACE_SECONDS;
    # the job's agent is by then the next claimer, not this holder.
    first, first_caller = _agent(world, "gpu-1", ["gpu"])
    second, _ = _agent(world, "gpu-2", ["gpu"])
    body = _create(world, labels=["gpu"])
    claim = first_caller.post(f"job-agents/{first.id}/jobs/claim").json()["claim"]["claim_id"]
    lifecycle.requeue_job(body["id"], actor="test")
    (grant,) = lifecycle.claim_next(second, limit=1)
    assert grant.job.id == uuid.UUID(body["id"])

    def append(caller, claim_id, data):
        return caller.request("PATCH", f"jobs/{body['id']}/log", raw=data,
                              content_type="text/plain", headers={"X-Claim-Id": claim_id})

    r = append(first_caller, claim, b"last lines\n")
    assert r.status_code == 202 and r.json() == {"attempt": 1, "length": 11}
    # Another agent of the label set that never held that claim may not.
    third, third_caller = _agent(world, "gpu-3", ["gpu"])
    assert append(third_caller, claim, b"x").status_code in (404, 409)
    # After the grace period, the holder's append is refused like any stale write.
    JobEvent.objects.filter(job_id=body["id"], claim_id=claim).update(
        created_at=NowPlusSeconds(-31))
    r = append(first_caller, claim, b"too late\n")
    assert r.status_code == 409 and r.json()["code"] == "claim_superseded"
