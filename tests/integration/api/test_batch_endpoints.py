"""The batch endpoints: POST job-agents/{id}/jobs/claim {"limit": N},
POST job-agents/{id}/heartbeat and POST job-agents/{id}/reports, in-process and over a live
server, on both backends."""

import datetime as dt
import uuid

import pytest

from jobqueue import lifecycle
from jobqueue.db import NowPlusSeconds
from jobqueue.models import Job, JobClaim, JobEvent
from tests.factories import JobFactory

from .answers import parse_ts

pytestmark = pytest.mark.django_db(transaction=True)


def batch_claim(caller, world, limit):
    r = caller.post(f"job-agents/{world.agent.id}/jobs/claim", json={"limit": limit})
    assert r.status_code == 200, r.text
    return r.json()["claims"]


def test_batch_claim_then_batch_heartbeat_over_http(live_world):
    JobFactory.create_batch(5, job_agent=live_world.agent, dispatch_context={"k": "v"})
    agent = live_world.agent_caller()
    claims = batch_claim(agent, live_world, 3)
    assert len(claims) == 3
    assert len({c["job"]["id"] for c in claims}) == 3
    assert all(c["job"]["dispatch_context"] == {"k": "v"} for c in claims)
    assert all(c["claim"]["attempt"] == 1 for c in claims)
    body = {"claims": [{"job_id": c["job"]["id"], "claim_id": c["claim"]["claim_id"]}
                       for c in claims]}
    r = agent.post(f"job-agents/{live_world.agent.id}/heartbeat", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert set(out) == {"server_time", "results"}
    assert [x["job_id"] for x in out["results"]] == [c["job"]["id"] for c in claims]
    for x, c in zip(out["results"], claims, strict=True):
        assert set(x) == {"job_id", "renewed", "claim_expires_at"} and x["renewed"] is True
        assert parse_ts(x["claim_expires_at"]) == \
            parse_ts(out["server_time"]) + dt.timedelta(seconds=30)
        assert parse_ts(x["claim_expires_at"]) >= parse_ts(c["claim"]["claim_expires_at"])
        assert JobClaim.objects.get(job_id=x["job_id"]).claim_expires_at == parse_ts(
            x["claim_expires_at"]
        )
    # The rest, then an empty batch (never 204 for the batch form).
    assert len(batch_claim(agent, live_world, 10)) == 2
    assert batch_claim(agent, live_world, 10) == []


def test_batch_heartbeat_answers_each_claim(world):
    agent = world.agent_caller()
    JobFactory.create_batch(4, job_agent=world.agent)
    live, expired, finished, cancelled = lifecycle.claim_next_jobs(world.agent, 4)
    JobClaim.objects.filter(job_id=expired.job.id).update(claim_expires_at=NowPlusSeconds(-1))
    lifecycle.report_status(finished.job.id, finished.claim_id, "successful")
    lifecycle.cancel_job(cancelled.job.id)
    foreign = JobFactory(job_agent=world.other_agent)
    foreign_grant = lifecycle.claim_job(world.other_agent, foreign.id)
    claims = [
        (live.job.id, live.claim_id),
        (expired.job.id, expired.claim_id),
        (finished.job.id, finished.claim_id),
        (cancelled.job.id, cancelled.claim_id),
        (foreign.id, foreign_grant.claim_id),
        (uuid.uuid4(), uuid.uuid4()),
    ]
    foreign_expiry = JobClaim.objects.get(job_id=foreign.id).claim_expires_at
    r = agent.post(
        f"job-agents/{world.agent.id}/heartbeat",
        json={"claims": [{"job_id": str(j), "claim_id": str(c)} for j, c in claims]},
    )
    assert r.status_code == 200, r.content
    results = r.json()["results"]
    assert [(x["job_id"], x["renewed"], x.get("code")) for x in results] == [
        (str(live.job.id), True, None),
        (str(expired.job.id), False, "lease_expired"),
        (str(finished.job.id), False, "job_finished"),
        (str(cancelled.job.id), False, "job_cancelled"),
        (str(foreign.id), False, "not_found"),
        (results[5]["job_id"], False, "not_found"),
    ]
    assert all(set(x) == {"job_id", "renewed", "code"} for x in results[1:])
    # Another agent's claim was not touched, and its job's timeline says nothing.
    assert JobClaim.objects.get(job_id=foreign.id).claim_expires_at == foreign_expiry
    assert not JobEvent.objects.filter(job_id=foreign.id, kind="stale_write_refused").exists()
    # The job table was not written by the heartbeat (updated_at of the live job unchanged).
    assert Job.objects.get(id=live.job.id).updated_at == live.job.updated_at


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"claims": []},
        {"claims": "x"},
        {"claims": [{"job_id": "nope", "claim_id": str(uuid.uuid4())}]},
        {"claims": [{"job_id": str(uuid.uuid4()), "claim_id": "nope"}]},
        {"claims": [{"job_id": str(uuid.uuid4())}]},
        {"claims": [[str(uuid.uuid4()), str(uuid.uuid4())]]},
        "DUPLICATE",
        "TOO_MANY",
    ],
)
def test_batch_heartbeat_bad_input_is_400_and_renews_nothing(world, body, settings):
    settings.JOBQUEUE = {"MAX_HEARTBEAT_BATCH": 2}
    JobFactory(job_agent=world.agent)
    (grant,) = lifecycle.claim_next_jobs(world.agent, 1)
    item = {"job_id": str(grant.job.id), "claim_id": str(grant.claim_id)}
    if body == "DUPLICATE":
        body = {"claims": [item, item]}
    elif body == "TOO_MANY":
        body = {"claims": [item] + [{"job_id": str(uuid.uuid4()),
                                     "claim_id": str(uuid.uuid4())} for _ in range(2)]}
    before = JobClaim.objects.get(job_id=grant.job.id).claim_expires_at
    r = world.agent_caller().post(f"job-agents/{world.agent.id}/heartbeat", json=body)
    assert r.status_code == 400, r.content
    assert r.json()["code"] == "validation_error"
    assert JobClaim.objects.get(job_id=grant.job.id).claim_expires_at == before


def test_batch_heartbeat_scope_and_auth(world):
    JobFactory(job_agent=world.agent)
    (grant,) = lifecycle.claim_next_jobs(world.agent, 1)
    body = {"claims": [{"job_id": str(grant.job.id), "claim_id": str(grant.claim_id)}]}
    path = f"job-agents/{world.agent.id}/heartbeat"
    # Another agent's token may not act as this agent.
    r = world.agent_caller(world.other_token).post(path, json=body)
    assert r.status_code == 404 and r.json()["code"] == "not_found"
    # Its own path: this job is not one of its jobs.
    r = world.agent_caller(world.other_token).post(
        f"job-agents/{world.other_agent.id}/heartbeat", json=body
    )
    assert r.status_code == 200 and r.json()["results"][0]["code"] == "not_found"
    assert world.anonymous().post(path, json=body).status_code == 401
    # The workspace key may renew for any agent of its workspace, never another's.
    r = world.producer().post(path, json=body)
    assert r.status_code == 200 and r.json()["results"][0]["renewed"] is True
    other_ws = world.producer().with_headers({"X-API-Key": world.other_key})
    r = other_ws.post(path, json=body)
    assert r.status_code in (403, 404)
    assert world.agent_caller().get(path).status_code == 405


# --- POST job-agents/{id}/reports ------------------------------------------------------------


def test_batch_claim_then_batch_report_over_http(live_world):
    JobFactory.create_batch(4, job_agent=live_world.agent)
    agent = live_world.agent_caller()
    claims = batch_claim(agent, live_world, 4)
    reports = [
        {"job_id": c["job"]["id"], "claim_id": c["claim"]["claim_id"], "status": status}
        for c, status in zip(claims, ["successful", "failure", "cancelled", "successful"],
                             strict=True)
    ]
    reports[1] |= {"message": "exit 3", "result": {"code": 3}, "external_id": "run-7"}
    path = f"job-agents/{live_world.agent.id}/reports"
    r = agent.post(path, json={"reports": reports})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["job_id"] for x in results] == [x["job_id"] for x in reports]
    for x, sent in zip(results, reports, strict=True):
        assert set(x) == {"job_id", "accepted", "status", "completed_at"}
        assert x["accepted"] is True and x["status"] == sent["status"]
        job = Job.objects.get(id=x["job_id"])
        assert job.status == sent["status"] and job.completed_at == parse_ts(x["completed_at"])
    failed = Job.objects.get(id=reports[1]["job_id"])
    assert (failed.message, failed.result, failed.external_id) == ("exit 3", {"code": 3},
                                                                   "run-7")
    assert not JobClaim.objects.exists()
    # The same batch again (a lost response): the same answers, nothing new recorded.
    n_events = JobEvent.objects.count()
    again = agent.post(path, json={"reports": reports})
    assert again.status_code == 200 and again.json() == r.json()
    assert JobEvent.objects.count() == n_events
    # With another status now: job_finished each, recorded as refusals.
    changed = [x | {"status": "failure" if x["status"] != "failure" else "successful"}
               for x in reports]
    r = agent.post(path, json={"reports": changed})
    assert [(x["accepted"], x["code"]) for x in r.json()["results"]] == [
        (False, "job_finished"), (False, "job_finished"), (False, "job_cancelled"),
        (False, "job_finished")]
    assert JobEvent.objects.filter(kind="stale_write_refused").count() == 4


def test_batch_report_answers_each_report(world):
    JobFactory.create_batch(3, job_agent=world.agent)
    live, superseded, cancelled = lifecycle.claim_next_jobs(world.agent, 3)
    lifecycle.requeue_job(superseded.job.id)
    lifecycle.cancel_job(cancelled.job.id)
    foreign = JobFactory(job_agent=world.other_agent)
    foreign_grant = lifecycle.claim_job(world.other_agent, foreign.id)
    body = {"reports": [
        {"job_id": str(g.job.id), "claim_id": str(g.claim_id), "status": "successful"}
        for g in (live, superseded, cancelled, foreign_grant)
    ]}
    r = world.agent_caller().post(f"job-agents/{world.agent.id}/reports", json=body)
    assert r.status_code == 200, r.content
    results = r.json()["results"]
    assert [(x["accepted"], x.get("code")) for x in results] == [
        (True, None), (False, "claim_superseded"), (False, "job_cancelled"),
        (False, "not_found")]
    assert all(set(x) == {"job_id", "accepted", "code"} for x in results[1:])
    assert Job.objects.get(id=foreign.id).status == "in_progress"
    assert not JobEvent.objects.filter(job_id=foreign.id, kind="stale_write_refused").exists()


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"reports": []},
        {"reports": "x"},
        {"reports": [{"job_id": "nope", "claim_id": str(uuid.uuid4()), "status": "successful"}]},
        {"reports": [{"job_id": str(uuid.uuid4()), "claim_id": str(uuid.uuid4())}]},
        {"reports": [{"job_id": str(uuid.uuid4()), "claim_id": str(uuid.uuid4()),
                      "status": "in_progress"}]},
        {"reports": [{"job_id": str(uuid.uuid4()), "claim_id": str(uuid.uuid4()),
                      "status": "successful", "external_id": "x" * 256}]},
        {"reports": [{"job_id": str(uuid.uuid4()), "claim_id": str(uuid.uuid4()),
                      "status": "successful", "message": ["not", "text"]}]},
        {"reports": ["not an object"]},
        {"reports": [{"job_id": str(uuid.uuid4()), "claim_id": None, "status": "successful"}]},
        {"reports": [{"job_id": str(uuid.uuid4()), "claim_id": str(uuid.uuid4()),
                      "status": "expired"}]},
        {"reports": [{"job_id": str(uuid.uuid4()), "claim_id": str(uuid.uuid4()),
                      "status": "successful", "message": "a\x00b"}]},
        {"reports": [{"job_id": str(uuid.uuid4()), "claim_id": str(uuid.uuid4()),
                      "status": "successful", "result": {"k": ["ok", "a\x00"]}}]},
        "DUPLICATE",
        "TOO_MANY",
    ],
)
def test_batch_report_bad_input_is_400_and_ends_nothing(world, body, settings):
    settings.JOBQUEUE = {"MAX_REPORT_BATCH": 2}
    JobFactory(job_agent=world.agent)
    (grant,) = lifecycle.claim_next_jobs(world.agent, 1)
    item = {"job_id": str(grant.job.id), "claim_id": str(grant.claim_id), "status": "successful"}
    if body == "DUPLICATE":
        body = {"reports": [item, item]}
    elif body == "TOO_MANY":
        body = {"reports": [item] + [item | {"job_id": str(uuid.uuid4())} for _ in range(2)]}
    elif body.get("reports") and isinstance(body["reports"], list):
        body = {"reports": [item, *body["reports"]]}
    r = world.agent_caller().post(f"job-agents/{world.agent.id}/reports", json=body)
    assert r.status_code == 400, r.content
    assert r.json()["code"] == "validation_error"
    assert Job.objects.get(id=grant.job.id).status == "in_progress"
    assert JobClaim.objects.filter(job_id=grant.job.id).exists()


def test_batch_report_scope_and_auth(world):
    JobFactory(job_agent=world.agent)
    (grant,) = lifecycle.claim_next_jobs(world.agent, 1)
    body = {"reports": [{"job_id": str(grant.job.id), "claim_id": str(grant.claim_id),
                         "status": "successful"}]}
    path = f"job-agents/{world.agent.id}/reports"
    r = world.agent_caller(world.other_token).post(path, json=body)
    assert r.status_code == 404 and r.json()["code"] == "not_found"
    r = world.agent_caller(world.other_token).post(
        f"job-agents/{world.other_agent.id}/reports", json=body
    )
    assert r.status_code == 200 and r.json()["results"][0]["code"] == "not_found"
    assert world.anonymous().post(path, json=body).status_code == 401
    other_ws = world.producer().with_headers({"X-API-Key": world.other_key})
    assert other_ws.post(path, json=body).status_code in (403, 404)
    assert world.agent_caller().get(path).status_code == 405
    assert Job.objects.get(id=grant.job.id).status == "in_progress"
    r = world.producer().post(path, json=body)
    assert r.status_code == 200 and r.json()["results"][0]["accepted"] is True


def test_the_edge_hands_the_lifecycle_typed_values(world):
    """The batch bodies are parsed once, by their serializers, into the lifecycle's typed
    values (UUIDs, ClaimRef, ReportItem), which the lifecycle takes as they are."""
    from agents.serializers.job_agents import BatchHeartbeatInput, BatchReportInput

    JobFactory.create_batch(2, job_agent=world.agent)
    first, second = lifecycle.claim_next_jobs(world.agent, 2)
    heartbeat = BatchHeartbeatInput(data={"claims": [
        {"job_id": str(first.job.id), "claim_id": str(first.claim_id)}]})
    assert heartbeat.is_valid(), heartbeat.errors
    claims = heartbeat.validated_data["claims"]
    assert claims == [lifecycle.ClaimRef(first.job.id, first.claim_id)]
    assert lifecycle.heartbeat_many(world.agent.id, claims).results[0].renewed
    reports = BatchReportInput(data={"reports": [
        {"job_id": str(first.job.id), "claim_id": str(first.claim_id), "status": "successful",
         "message": "done"},
        {"job_id": str(second.job.id), "claim_id": str(second.claim_id), "status": "failure"},
    ]})
    assert reports.is_valid(), reports.errors
    items = reports.validated_data["reports"]
    assert items == [
        lifecycle.ReportItem(first.job.id, first.claim_id, "successful", message="done"),
        lifecycle.ReportItem(second.job.id, second.claim_id, "failure"),
    ]
    out = lifecycle.report_many(world.agent.id, items)
    assert [(r.job_id, r.accepted) for r in out.results] == [(first.job.id, True),
                                                             (second.job.id, True)]
