"""The access matrix: who may call what. In-process client (the whole Django/DRF stack).

Rules: another workspace's or another agent's objects answer 404 on every endpoint; an agent
token gets 403 on producer/operator endpoints about its own agent and jobs (and where the path
names no object); revoked and malformed credentials get 401 with WWW-Authenticate. A refused
call changes nothing.
"""

import pytest

from agents import credentials, registration
from agents.models import AgentToken, RegistrationToken
from jobqueue import lifecycle
from jobqueue.lifecycle import fairness, ratelimits, schedules
from jobqueue.maintenance import webhooks
from jobqueue.models import (
    FairnessKey,
    Job,
    JobAgent,
    JobArtifact,
    JobDependency,
    JobEffect,
    JobEvent,
    JobGroup,
    JobLog,
    RateLimit,
    Schedule,
    ScheduleFire,
    WebhookEndpoint,
)
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db

UNUSED_CLAIM = "00000000-0000-4000-8000-000000000000"


def endpoints(agent_id, job_id, claim_id, token_id, webhook_id="w", group="run",
              schedule_id="s", registration_id="r", rate_key="k", fair_key="k"):
    """(name, method, path, body) for every endpoint, aimed at the given objects."""
    return [
        ("poll", "GET", f"job-agents/{agent_id}/jobs", None),
        ("claim", "POST", f"job-agents/{agent_id}/jobs/{job_id}/claim", None),
        ("claim_next", "POST", f"job-agents/{agent_id}/jobs/claim", None),
        ("heartbeat", "POST", f"jobs/{job_id}/heartbeat", {"claim_id": claim_id}),
        # (before status: the agent's own calls run in this order while it holds the job)
        ("append_log", "PATCH", f"jobs/{job_id}/log", {"claim_id": claim_id}),
        ("read_log", "GET", f"jobs/{job_id}/log", None),
        ("upload_artifact", "PUT", f"jobs/{job_id}/artifacts/a.txt", {"claim_id": claim_id}),
        ("list_artifacts", "GET", f"jobs/{job_id}/artifacts", None),
        ("download_artifact", "GET", f"jobs/{job_id}/artifacts/a.txt", None),
        ("begin_effect", "POST", f"jobs/{job_id}/effects/charge/begin", {"claim_id": claim_id}),
        ("commit_effect", "PUT", f"jobs/{job_id}/effects/charge",
         {"claim_id": claim_id, "result": "done"}),
        ("list_effects", "GET", f"jobs/{job_id}/effects", None),
        ("status", "PUT", f"jobs/{job_id}/status", {"claim_id": claim_id, "status": "failure"}),
        ("release", "POST", f"jobs/{job_id}/release", {"claim_id": claim_id}),
        ("claim_state", "GET", f"jobs/{job_id}/claims/{claim_id}", None),
        ("list_jobs", "GET", "jobs", None),
        ("create_job", "POST", "jobs", {"job_agent_id": str(agent_id)}),
        ("create_flow", "POST", "flows", {"jobs": [
            {"ref": "a", "job_agent_id": str(agent_id), "depends_on": [str(job_id)]}]}),
        ("get_job", "GET", f"jobs/{job_id}", None),
        ("explain_job", "GET", f"jobs/{job_id}/explain", None),
        ("cancel", "POST", f"jobs/{job_id}/cancel", None),
        ("requeue", "POST", f"jobs/{job_id}/requeue", None),
        ("dispatch", "POST", f"jobs/{job_id}/dispatch", None),
        ("list_agents", "GET", "job-agents", None),
        ("create_agent", "POST", "job-agents", {"name": "intruder"}),
        ("get_agent", "GET", f"job-agents/{agent_id}", None),
        ("update_agent", "PATCH", f"job-agents/{agent_id}", {"labels": ["intruder"]}),
        ("pause_agent", "POST", f"job-agents/{agent_id}/pause", None),
        ("resume_agent", "POST", f"job-agents/{agent_id}/resume", None),
        ("issue_token", "POST", f"job-agents/{agent_id}/tokens", {"name": "x"}),
        ("list_tokens", "GET", f"job-agents/{agent_id}/tokens", None),
        ("rotate_token", "POST", f"job-agents/{agent_id}/tokens/rotate", {}),
        ("revoke_token", "DELETE", f"job-agents/{agent_id}/tokens/{token_id}", None),
        ("get_group", "GET", f"groups/{group}", None),
        ("cancel_group", "POST", f"groups/{group}/cancel", None),
        ("list_webhooks", "GET", "webhooks", None),
        ("create_webhook", "POST", "webhooks", {"url": "http://127.0.0.1:9/intruder"}),
        ("delete_webhook", "DELETE", f"webhooks/{webhook_id}", None),
        ("webhook_deliveries", "GET", f"webhooks/{webhook_id}/deliveries", None),
        ("list_schedules", "GET", "schedules", None),
        ("create_schedule", "POST", "schedules",
         {"name": "intruder", "cron": "* * * * *", "job": {"job_agent_id": str(agent_id)}}),
        ("get_schedule", "GET", f"schedules/{schedule_id}", None),
        ("update_schedule", "PATCH", f"schedules/{schedule_id}", {"paused": True}),
        ("trigger_schedule", "POST", f"schedules/{schedule_id}/trigger", None),
        ("delete_schedule", "DELETE", f"schedules/{schedule_id}", None),
        ("list_registration_tokens", "GET", "registration-tokens", None),
        ("issue_registration_token", "POST", "registration-tokens", {}),
        ("revoke_registration_token", "DELETE", f"registration-tokens/{registration_id}", None),
        ("list_rate_limits", "GET", "rate-limits", None),
        ("set_rate_limit", "PUT", f"rate-limits/{rate_key}", {"count": 5, "period_seconds": 60}),
        ("get_rate_limit", "GET", f"rate-limits/{rate_key}", None),
        ("delete_rate_limit", "DELETE", f"rate-limits/{rate_key}", None),
        ("list_fairness_keys", "GET", "fairness-keys", None),
        ("set_fairness_weight", "PUT", f"fairness-keys/{fair_key}", {"weight": 5}),
        ("get_fairness_weight", "GET", f"fairness-keys/{fair_key}", None),
        ("delete_fairness_weight", "DELETE", f"fairness-keys/{fair_key}", None),
    ]


ENDPOINT_NAMES = [e[0] for e in endpoints("a", "j", "c", "t")]
AGENT_ENDPOINTS = {"poll", "claim", "claim_next", "heartbeat", "status", "release",
                   "claim_state", "append_log", "read_log", "upload_artifact", "begin_effect",
                   "commit_effect", "rotate_token"}
# Endpoints whose path names no agent or job: an agent token learns nothing, gets 403. (A
# rate limit's or a fairness key's PUT sets the key's limit or weight of the workspace in the
# path, whatever another workspace has for the same key.)
NO_OBJECT_IN_PATH = {"list_jobs", "create_job", "create_flow", "list_agents", "create_agent",
                     "list_webhooks", "create_webhook", "list_schedules", "create_schedule",
                     "list_registration_tokens", "issue_registration_token", "list_rate_limits",
                     "set_rate_limit", "list_fairness_keys", "set_fairness_weight"}
# The workspace's own webhooks, schedules, rate limits and weights: only its key, an agent
# token gets 403 (they name no agent or job).
WEBHOOK_OBJECTS = {"delete_webhook", "webhook_deliveries", "get_schedule", "update_schedule",
                   "trigger_schedule", "delete_schedule", "revoke_registration_token",
                   "get_rate_limit", "delete_rate_limit", "get_fairness_weight",
                   "delete_fairness_weight"}
# A group belongs to the workspace, not to an agent: an agent token gets 403 on any group.
GROUP_ENDPOINTS = {"get_group", "cancel_group"}
CREATES = {"create_agent", "create_webhook", "issue_registration_token", "set_rate_limit",
           "set_fairness_weight"}
# A body naming another workspace's object: 400 naming the field, nothing created.
BODY_REFERENCES = {"create_job": "job_agent_id", "create_schedule": "job",
                   "create_flow": "jobs[0].job_agent_id"}


def _claimed(agent, group):
    JobGroup.objects.create(workspace_id=agent.workspace_id, name=group)
    job = JobFactory(job_agent=agent, dispatch_context={"secret": "x"}, group=group)
    grant = lifecycle.claim_job(agent, job.id)
    return job, str(grant.claim_id)


def _snapshot():
    return (
        sorted(Job.objects.values_list("id", "status", "attempt", "updated_at")),
        JobEvent.objects.count(),
        sorted(JobAgent.objects.values_list("id", "paused_at", "labels", "lease_seconds")),
        sorted(AgentToken.objects.values_list("id", "revoked_at", "expires_at", "replaced_by")),
        sorted(JobGroup.objects.values_list("id", "cancelled_at")),
        sorted(WebhookEndpoint.objects.values_list("id", flat=True)),
        sorted(JobLog.objects.values_list("job_id", "attempt", "length")),
        sorted(JobArtifact.objects.values_list("job_id", "name", "state", "published_at")),
        sorted(JobEffect.objects.values_list("job_id", "key", "attempt", "committed_at")),
        sorted(Schedule.objects.values_list("id", "name", "paused_at", "last_job_id")),
        sorted(RegistrationToken.objects.values_list("id", "uses", "revoked_at")),
        ScheduleFire.objects.count(),
        sorted(JobDependency.objects.values_list("child_id", "parent_id")),
        sorted(Job.objects.values_list("id", "has_dependents")),
        sorted(RateLimit.objects.values_list("workspace_id", "key", "count", "period_seconds",
                                             "updated_at")),
        sorted(FairnessKey.objects.values_list("workspace_id", "key", "weight", "updated_at")),
    )


def _call(caller, method, path, body):
    if (method == "PATCH" and path.endswith("/log")) or (method == "PUT" and "/artifacts/" in
                                                          path):
        # raw bytes, the claim in a header
        return caller.request(method, path, raw=b"a line\n", content_type="text/plain",
                              headers={"X-Claim-Id": body["claim_id"]})
    return caller.request(method, path, json_body=body)


@pytest.fixture
def targets(world):
    job_b, claim_b = _claimed(world.other_agent, "run-b")
    token_b = AgentToken.objects.filter(job_agent=world.other_agent).first()
    job_y, claim_y = _claimed(world.other_workspace_agent, "run-y")
    token_y, _ = credentials.create_agent_token(world.other_workspace_agent)
    job_a, claim_a = _claimed(world.agent, "run-a")
    token_a = AgentToken.objects.filter(job_agent=world.agent).first()
    hook_a, _ = webhooks.create_endpoint(world.workspace.id, "http://127.0.0.1:9/a")
    hook_y, _ = webhooks.create_endpoint(world.other_workspace.id, "http://127.0.0.1:9/y")
    sched_a = schedules.create_schedule(workspace=world.workspace, name="a",
                                        cron_expr="* * * * *", job_agent=world.agent, job={})
    sched_y = schedules.create_schedule(workspace=world.other_workspace, name="y",
                                        cron_expr="* * * * *",
                                        job_agent=world.other_workspace_agent, job={})
    reg_a, _ = registration.issue(world.workspace.id)
    reg_y, _ = registration.issue(world.other_workspace.id)
    # A key with a "/" and a space (percent-encoded in the path): each workspace's own.
    ratelimits.set_limit(world.workspace.id, "api/a x", 5, 60)
    ratelimits.set_limit(world.other_workspace.id, "api/other x", 5, 60)
    fairness.set_weight(world.workspace.id, "tenant/a x", 5)
    fairness.set_weight(world.other_workspace.id, "tenant/other x", 5)
    return {
        "b": endpoints(world.other_agent.id, job_b.id, claim_b, token_b.id, hook_a.id,
                       "run-b", sched_a.id, reg_a.id, "api/a%20x", "tenant/a%20x"),
        "y": endpoints(world.other_workspace_agent.id, job_y.id, claim_y, token_y.id,
                       hook_y.id, "run-y", sched_y.id, reg_y.id, "api/other%20x",
                       "tenant/other%20x"),
        "a": endpoints(world.agent.id, job_a.id, claim_a, token_a.id, hook_a.id, "run-a",
                       sched_a.id, reg_a.id, "api/a%20x", "tenant/a%20x"),
    }


@pytest.mark.parametrize("name", ENDPOINT_NAMES)
def test_agent_token_cannot_reach_another_agent(world, targets, name):
    _, method, path, body = next(e for e in targets["b"] if e[0] == name)
    before = _snapshot()
    r = _call(world.agent_caller(), method, path, body)
    expected = 403 if name in NO_OBJECT_IN_PATH | WEBHOOK_OBJECTS | GROUP_ENDPOINTS else 404
    assert r.status_code == expected, (name, r.status_code, r.content)
    assert r.json()["code"] == ("permission_denied" if expected == 403 else "not_found")
    assert _snapshot() == before


@pytest.mark.parametrize("name", sorted(set(ENDPOINT_NAMES) - AGENT_ENDPOINTS))
def test_agent_token_is_forbidden_producer_endpoints_on_its_own_objects(world, targets, name):
    _, method, path, body = next(e for e in targets["a"] if e[0] == name)
    before = _snapshot()
    r = _call(world.agent_caller(), method, path, body)
    assert r.status_code == 403, (name, r.status_code, r.content)
    assert r.json()["code"] == "permission_denied"
    assert _snapshot() == before


@pytest.mark.parametrize("name", ENDPOINT_NAMES)
def test_workspace_key_cannot_reach_another_workspace(world, targets, name):
    _, method, path, body = next(e for e in targets["y"] if e[0] == name)
    before = _snapshot()
    producer = world.producer()
    # The other workspace in the path: 404 everywhere.
    r = _call(producer, method, f"/v1/workspaces/{world.other_workspace.id}/{path}", body)
    assert r.status_code == 404 and r.json()["code"] == "not_found", (name, r.content)
    # Its own workspace in the path, the other workspace's objects: 404 (or, for a reference
    # in the body, 400), and list endpoints show nothing of the other workspace.
    r = _call(producer, method, path, body)
    if name in BODY_REFERENCES:
        assert r.status_code == 400 and BODY_REFERENCES[name] in r.json()["fields"], r.content
    elif name in NO_OBJECT_IN_PATH:
        assert r.status_code in (200, 201)
        assert str(targets["y"][0][2].split("/")[1]) not in r.content.decode()
        assert "/y" not in r.content.decode()  # nor the other workspace's webhook
    else:
        assert r.status_code == 404 and r.json()["code"] == "not_found", (name, r.content)
    if name not in CREATES:
        assert _snapshot() == before


@pytest.mark.parametrize("endpoint", ["jobs", "flows"])
def test_another_workspaces_job_as_a_dependency_is_an_unknown_one(world, targets, endpoint):
    """Another workspace's job in depends_on (or a flow's) is the same 400 as an id that
    names no job, naming the field, and nothing is created or marked."""
    import uuid

    foreign = targets["y"][1][2].split("/")[3]  # the other workspace's claimed job
    answers = []
    for parent in (foreign, str(uuid.uuid4())):
        job = {"job_agent_id": str(world.agent.id), "depends_on": [parent]}
        body = job if endpoint == "jobs" else {"jobs": [{"ref": "a", **job}]}
        before = _snapshot()
        r = world.producer().post(endpoint, json=body)
        assert _snapshot() == before
        answers.append((r.status_code, r.json()))
    assert answers[0] == answers[1]
    status, body = answers[0]
    field = "depends_on" if endpoint == "jobs" else "jobs[0].depends_on"
    assert status == 400 and body["code"] == "validation_error"
    assert list(body["fields"]) == [field]


def test_the_key_may_drive_its_own_agents(world, targets):
    producer = world.producer()
    agent_id = world.agent.id
    job = JobFactory(job_agent=world.agent)
    assert producer.get(f"job-agents/{agent_id}/jobs").status_code == 200
    claim = producer.post(f"job-agents/{agent_id}/jobs/{job.id}/claim")
    assert claim.status_code == 200
    claim_id = claim.json()["claim"]["claim_id"]
    assert producer.post(f"jobs/{job.id}/heartbeat", json={"claim_id": claim_id}).status_code \
        == 200
    done = producer.put(f"jobs/{job.id}/status", json={"claim_id": claim_id, "status": "failure"})
    assert done.status_code == 200 and done.json()["status"] == "failure"


def test_agent_token_works_on_its_own_agent_endpoints(world, targets):
    caller = world.agent_caller()
    for name, method, path, body in targets["a"]:
        if name in AGENT_ENDPOINTS - {"claim", "release"}:
            r = _call(caller, method, path, body)
            assert r.status_code in (200, 201, 202, 204), (name, r.content)


def test_agent_tokens_are_managed_by_the_key(world):
    producer = world.producer()
    issued = producer.post(f"job-agents/{world.agent.id}/tokens", json={"name": "ci"})
    assert issued.status_code == 201
    body = issued.json()
    assert body["token"].startswith("jqa_") and body["name"] == "ci"
    new_token = world.agent_caller(body["token"])
    assert new_token.get(f"job-agents/{world.agent.id}/jobs").status_code == 200
    # The stored row holds no secret.
    row = AgentToken.objects.get(id=body["id"])
    assert body["token"] not in (row.secret_hash, row.prefix)
    revoked = producer.delete(f"job-agents/{world.agent.id}/tokens/{body['id']}")
    assert revoked.status_code == 204
    again = producer.delete(f"job-agents/{world.agent.id}/tokens/{body['id']}")
    assert again.status_code == 204
    r = new_token.get(f"job-agents/{world.agent.id}/jobs")
    assert r.status_code == 401 and r.json()["code"] == "authentication_failed"
    assert r.headers["WWW-Authenticate"].startswith("Bearer")
    # The agent's other token still works.
    assert world.agent_caller().get(f"job-agents/{world.agent.id}/jobs").status_code == 200


def test_revoked_workspace_key_is_refused_at_once(world):
    key = credentials.resolve_api_key(world.key)
    assert world.producer().get("jobs").status_code == 200
    credentials.revoke_workspace_api_key(key)
    r = world.producer().get("jobs")
    assert r.status_code == 401 and r.json()["code"] == "authentication_failed"
    assert "WWW-Authenticate" in r.headers


@pytest.mark.parametrize(
    "headers, code",
    [
        ({}, "not_authenticated"),
        ({"Authorization": "Bearer"}, "authentication_failed"),
        ({"Authorization": "Bearer a b"}, "authentication_failed"),
        ({"Authorization": "Bearer jqa_short_x"}, "authentication_failed"),
        ({"Authorization": "Bearer jqa_000000000000_" + "x" * 43}, "authentication_failed"),
        ({"Authorization": "Basic dXNlcjpwYXNz"}, "not_authenticated"),
        ({"Authorization": "Token abc"}, "not_authenticated"),
        ({"X-API-Key": ""}, "authentication_failed"),
        ({"X-API-Key": "nonsense"}, "authentication_failed"),
        ({"X-API-Key": "jqk_" + "x" * 300}, "authentication_failed"),
        # A NUL in the lookup prefix must not reach the database (PostgreSQL refuses it).
        ({"X-API-Key": "jqk_aaaaaaaaaa\x00a_x"}, "authentication_failed"),
        ({"Authorization": "Bearer jqa_aaaaaaaaaa\x00a_x"}, "authentication_failed"),
    ],
)
def test_missing_and_malformed_credentials(world, headers, code):
    caller = world.anonymous().with_headers(headers)
    before = _snapshot()
    for path in ("jobs", f"job-agents/{world.agent.id}/jobs"):
        r = caller.get(path)
        assert r.status_code == 401, (headers, r.content)
        assert r.json()["code"] == code
        assert r.headers.get("WWW-Authenticate")
    r = caller.post(f"job-agents/{world.agent.id}/jobs/claim")
    assert r.status_code == 401
    assert _snapshot() == before


def test_credentials_of_the_wrong_kind_are_refused(world):
    swapped = world.anonymous().with_headers(
        {"X-API-Key": world.token, "Authorization": f"Bearer {world.key}"}
    )
    r = swapped.get("jobs")
    assert r.status_code == 401 and r.json()["code"] == "authentication_failed"


def _public_answers(world, path):
    """GET `path` as every kind of caller (anonymous, producer, agent, a malformed API key or
    token): each is a 200 without WWW-Authenticate, all alike. The responses."""
    callers = [world.anonymous(), world.producer(), world.agent_caller(),
               world.anonymous().with_headers({"X-API-Key": "nonsense"}),
               world.anonymous().with_headers({"Authorization": "Bearer jqa_short_x"})]
    responses = [caller.get(path) for caller in callers]
    for r in responses:
        assert r.status_code == 200, r.content
        assert "WWW-Authenticate" not in r.headers
        assert r.json() == responses[0].json()
    return responses


def test_the_version_is_public_to_every_caller(world):
    """GET /v1/version (outside any workspace) answers everyone alike, with or without a
    credential, a valid, revoked or malformed one; it changes nothing."""
    before = _snapshot()
    [answer, *_] = _public_answers(world, "/v1/version")
    assert set(answer.json()) == {"server", "version", "api", "min_client_version"}
    assert _snapshot() == before


def test_the_jwks_is_public_to_every_caller(world):
    """GET /v1/.well-known/jwks.json (the keys that verify fencing tokens) answers everyone
    alike, with or without a credential, a valid or a malformed one, cacheable; it changes
    nothing and publishes no private part."""
    before = _snapshot()
    answers = _public_answers(world, "/v1/.well-known/jwks.json")
    for r in answers:
        assert r.headers["Cache-Control"].startswith("public, max-age=")
    [key] = answers[0].json()["keys"]
    assert set(key) == {"kty", "crv", "x", "kid", "alg", "use"}  # no "d"
    assert _snapshot() == before


@pytest.mark.parametrize("name", ["read_log", "download_artifact"])
def test_head_is_refused_as_get_is_and_writes_nothing(world, targets, name):
    """HEAD (which once ran the write path of these endpoints) answers each caller with the
    status GET gets, with no body, and changes nothing, a claim header or not."""
    for caller, target in ((world.agent_caller(), "b"), (world.producer(), "y")):
        _, _, path, _ = next(e for e in targets[target] if e[0] == name)
        _, _, _, held = next(e for e in targets[target] if e[0] == "heartbeat")
        before = _snapshot()
        got = caller.request("GET", path)
        head = caller.request("HEAD", path, headers={"X-Claim-Id": held["claim_id"]})
        assert (head.status_code, got.status_code) == (404, 404), (name, target)
        assert head.content == b"" and _snapshot() == before
