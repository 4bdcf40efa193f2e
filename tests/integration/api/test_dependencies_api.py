"""Dependencies and flows over HTTP (#30 item 2; docs/api.md "Dependencies and flows"):
POST jobs depends_on, POST flows, waiting_on and depends_on in a job's representation,
`parents` in the claim answer; bad input is a 400 naming the field, nothing created."""

import pytest

from jobqueue.models import Job, JobDependency


def _claim(world, job_id=None):
    path = f"job-agents/{world.agent.id}/jobs/" + (f"{job_id}/claim" if job_id else "claim")
    return world.agent_caller().post(path)


def _succeed(world, job_id, result=None):
    claim = _claim(world, job_id)
    assert claim.status_code == 200, claim.content
    r = world.agent_caller().put(f"jobs/{job_id}/status", json={
        "claim_id": claim.json()["claim"]["claim_id"], "status": "successful",
        **({"result": result} if result is not None else {})})
    assert r.status_code == 200, r.content


def test_a_dependent_job_waits_and_its_claim_carries_its_parents(world):
    producer = world.producer()
    agent = str(world.agent.id)
    parent = producer.post("jobs", json={"job_agent_id": agent}).json()
    assert parent["depends_on"] == [] and parent["waiting_on"] == []
    made = producer.post("jobs", json={"job_agent_id": agent, "depends_on": [parent["id"]]})
    assert made.status_code == 201, made.content
    child = made.json()
    assert child["status"] == "pending"
    assert child["depends_on"] == child["waiting_on"] == [parent["id"]]
    detail = producer.get(f"jobs/{child['id']}").json()
    assert detail["waiting_on"] == [parent["id"]]
    listed = {j["id"]: j for j in producer.get("jobs").json()["results"]}
    assert listed[child["id"]]["waiting_on"] == [parent["id"]]
    assert listed[parent["id"]]["waiting_on"] == []
    dispatch = producer.post(f"jobs/{child['id']}/dispatch")
    assert dispatch.status_code == 409
    # The parent's claim carries no parents; its success queues the child.
    plain = _claim(world, parent["id"]).json()
    assert plain["claim"]["parents"] == []
    world.agent_caller().put(f"jobs/{parent['id']}/status", json={
        "claim_id": plain["claim"]["claim_id"], "status": "successful",
        "result": {"rows": 7}})
    assert producer.get(f"jobs/{child['id']}").json()["status"] == "queued"
    claim = _claim(world).json()
    assert claim["job"]["id"] == child["id"]
    assert claim["claim"]["parents"] == [
        {"job_id": parent["id"], "status": "successful", "result": {"rows": 7}}]


@pytest.mark.parametrize("depends_on", [[], ["nope"], "x", [None],
                                        ["00000000-0000-4000-8000-000000000000"]])
def test_bad_dependencies_are_a_400_naming_the_field(world, depends_on):
    r = world.producer().post("jobs", json={"job_agent_id": str(world.agent.id),
                                            "depends_on": depends_on})
    assert r.status_code == 400, r.content
    assert r.json()["code"] == "validation_error" and list(r.json()["fields"]) == ["depends_on"]
    assert Job.objects.count() == 0


def test_more_than_a_hundred_dependencies_are_refused(world):
    parent = world.producer().post("jobs", json={"job_agent_id": str(world.agent.id)}).json()
    r = world.producer().post("jobs", json={"job_agent_id": str(world.agent.id),
                                            "depends_on": [parent["id"]] * 101})
    assert r.status_code == 400 and list(r.json()["fields"]) == ["depends_on"]


def test_hold_with_dependencies_is_refused(world):
    parent = world.producer().post("jobs", json={"job_agent_id": str(world.agent.id)}).json()
    r = world.producer().post("jobs", json={"job_agent_id": str(world.agent.id), "hold": True,
                                            "depends_on": [parent["id"]]})
    assert r.status_code == 400 and list(r.json()["fields"]) == ["depends_on"]


def test_extract_then_load_as_a_flow(world):
    """Seed 002's hand-written chain (its result handler created the load when the extract
    succeeded, and cancelled the run's jobs when one failed) as one flow."""
    producer = world.producer()
    agent = str(world.agent.id)
    r = producer.post("flows", json={"jobs": [
        {"ref": "extract", "job_agent_id": agent, "dispatch_context": {"kind": "extract"},
         "group": "run-42"},
        {"ref": "load", "job_agent_id": agent, "dispatch_context": {"kind": "load"},
         "group": "run-42", "depends_on_refs": ["extract"]},
    ]})
    assert r.status_code == 201, r.content
    jobs = r.json()["jobs"]
    assert list(jobs) == ["extract", "load"]
    assert jobs["extract"]["status"] == "queued" and jobs["load"]["status"] == "pending"
    assert jobs["load"]["waiting_on"] == [jobs["extract"]["id"]]
    _succeed(world, jobs["extract"]["id"], {"blobPrefix": "runs/42/", "rows": 1000})
    claim = _claim(world).json()
    assert claim["job"]["dispatch_context"] == {"kind": "load"}
    assert claim["claim"]["parents"][0]["result"] == {"blobPrefix": "runs/42/", "rows": 1000}


def test_a_failed_extract_cancels_the_load(world):
    producer = world.producer()
    agent = str(world.agent.id)
    jobs = producer.post("flows", json={"jobs": [
        {"ref": "extract", "job_agent_id": agent},
        {"ref": "load", "job_agent_id": agent, "depends_on_refs": ["extract"]},
    ]}).json()["jobs"]
    assert producer.post(f"jobs/{jobs['extract']['id']}/cancel").status_code == 200
    load = producer.get(f"jobs/{jobs['load']['id']}").json()
    assert load["status"] == "cancelled"
    assert load["message"] == f"dependency_failed: {jobs['extract']['id']}"
    assert load["waiting_on"] == []


@pytest.mark.parametrize(("jobs", "field"), [
    ([{"ref": "a"}, {"ref": "b", "depends_on_refs": ["c"]}], "jobs[1].depends_on_refs"),
    ([{"ref": "a", "depends_on_refs": ["b"]}, {"ref": "b"}], "jobs[0].depends_on_refs"),
    ([{"ref": "a"}, {"ref": "a"}], "jobs[1].ref"),
    ([{"ref": "a", "depends_on": ["00000000-0000-4000-8000-000000000000"]}],
     "jobs[0].depends_on"),
])
def test_a_bad_flow_is_a_400_naming_the_job_and_creates_nothing(world, jobs, field):
    agent = str(world.agent.id)
    r = world.producer().post("flows", json={"jobs": [{"job_agent_id": agent, **j}
                                                      for j in jobs]})
    assert r.status_code == 400, r.content
    assert r.json()["code"] == "validation_error" and list(r.json()["fields"]) == [field]
    assert Job.objects.count() == 0 and JobDependency.objects.count() == 0


@pytest.mark.parametrize("body", [{}, {"jobs": []}, {"jobs": "x"},
                                  {"jobs": [{"ref": "a"}]},
                                  {"jobs": [{"job_agent_id": "x", "ref": "a", "hold": True}]},
                                  {"jobs": [{"ref": "a", "unique_key": "k"}]}])
def test_a_flow_the_schema_refuses_is_a_400(world, body):
    r = world.producer().post("flows", json=body)
    assert r.status_code == 400, r.content
    assert r.json()["code"] == "validation_error" and "jobs" in r.json()["fields"]
    assert Job.objects.count() == 0


def test_a_flow_with_an_unknown_agent_is_a_400(world):
    r = world.producer().post("flows", json={"jobs": [
        {"ref": "a", "job_agent_id": str(world.agent.id)},
        {"ref": "b", "job_agent_id": str(world.other_workspace_agent.id)}]})
    assert r.status_code == 400 and list(r.json()["fields"]) == ["jobs[1].job_agent_id"]
    assert Job.objects.count() == 0
