"""Every admin page renders, and the job list's columns, filters and search work."""

import pytest
from django.urls import reverse

from jobqueue import states
from jobqueue.models import Job, ReaperRun
from tests.factories import JobAgentFactory

pytestmark = pytest.mark.django_db


def changelist_ids(response):
    return {obj.pk for obj in response.context["cl"].result_list}


def test_every_page_renders_for_an_operator(op_client, jobs, agent):
    from agents import credentials

    token, _ = credentials.create_agent_token(agent)
    key, _ = credentials.create_workspace_api_key(agent.workspace)
    run = ReaperRun.objects.first()
    job = jobs["stuck"]
    urls = [
        reverse("admin:index"),
        reverse("admin:app_list", args=["jobqueue"]),
        reverse("admin:jobqueue_workspace_changelist"),
        reverse("admin:jobqueue_workspace_add"),
        reverse("admin:jobqueue_workspace_change", args=[agent.workspace_id]),
        reverse("admin:jobqueue_jobagent_changelist"),
        reverse("admin:jobqueue_jobagent_add"),
        reverse("admin:jobqueue_jobagent_change", args=[agent.pk]),
        reverse("admin:jobqueue_job_changelist"),
        reverse("admin:jobqueue_job_change", args=[job.pk]),
        reverse("admin:jobqueue_job_history", args=[job.pk]),
        reverse("admin:jobqueue_job_recovery"),
        reverse("admin:jobqueue_job_concurrency"),
        reverse("admin:jobqueue_job_ratelimits"),
        reverse("admin:jobqueue_ratelimit_changelist"),
        reverse("admin:jobqueue_ratelimit_add"),
        reverse("admin:jobqueue_job_fairness"),
        reverse("admin:jobqueue_fairnesskey_changelist"),
        reverse("admin:jobqueue_fairnesskey_add"),
        reverse("admin:jobqueue_job_reap"),
        reverse("admin:jobqueue_reaperrun_changelist"),
        reverse("admin:jobqueue_reaperrun_change", args=[run.pk]),
        reverse("admin:agents_agenttoken_changelist"),
        reverse("admin:agents_agenttoken_add"),
        reverse("admin:agents_agenttoken_change", args=[token.pk]),
        reverse("admin:agents_workspaceapikey_changelist"),
        reverse("admin:agents_workspaceapikey_add"),
        reverse("admin:agents_workspaceapikey_change", args=[key.pk]),
    ]
    for url in urls:
        response = op_client.get(url)
        assert response.status_code == 200, url


def test_job_list_columns(op_client, jobs):
    response = op_client.get(reverse("admin:jobqueue_job_changelist"))
    html = response.content.decode()
    assert str(jobs["stuck"].id) in html
    assert "1 / 3" in html  # attempt / max of a claimed job
    assert "expires in" in html  # the healthy lease
    assert "expired 30\xa0seconds ago" in html or "expired 31\xa0seconds ago" in html  # stuck
    assert "none yet" in html  # no heartbeat on a fresh claim
    # The operator's tools are linked from the list.
    assert reverse("admin:jobqueue_job_recovery") in html
    assert reverse("admin:jobqueue_job_reap") in html


@pytest.mark.parametrize(
    "query, expected",
    [
        ("status__exact=queued", {"queued", "other"}),
        ("status__exact=in_progress", {"healthy", "stuck"}),
        ("status__exact=expired", {"dead"}),
        ("status__exact=successful", {"done"}),
        ("lease=healthy", {"healthy"}),
        ("lease=expired", {"stuck"}),
        ("lease=none", {"queued", "other", "dead", "done"}),
    ],
)
def test_job_filters(op_client, jobs, query, expected):
    response = op_client.get(reverse("admin:jobqueue_job_changelist") + "?" + query)
    assert response.status_code == 200
    assert changelist_ids(response) == {jobs[name].id for name in expected}


def test_job_filter_expiring_soon(op_client, jobs):
    from .conftest import expire_lease

    # 10 s left of a 60 s lease: less than a third.
    expire_lease(jobs["healthy"], seconds_ago=-10)
    url = reverse("admin:jobqueue_job_changelist")
    assert changelist_ids(op_client.get(url + "?lease=expiring")) == {jobs["healthy"].id}
    assert changelist_ids(op_client.get(url + "?lease=healthy")) == set()


def test_job_filters_by_agent_and_workspace(op_client, jobs, agent):
    url = reverse("admin:jobqueue_job_changelist")
    mine = {j.id for name, j in jobs.items() if name != "other"}
    by_agent = op_client.get(url + f"?job_agent__id__exact={agent.id}")
    assert changelist_ids(by_agent) == mine
    by_ws = op_client.get(url + f"?workspace__id__exact={jobs['other'].workspace_id}")
    assert changelist_ids(by_ws) == {jobs["other"].id}


@pytest.mark.parametrize(
    "term, expected",
    [
        ("idem-healthy", {"healthy"}),
        ("ext-healthy", {"healthy"}),
        ("no-such-thing", set()),
        ("'; DROP TABLE job; --", set()),
    ],
)
def test_job_search(op_client, jobs, term, expected):
    response = op_client.get(reverse("admin:jobqueue_job_changelist"), {"q": term})
    assert response.status_code == 200
    assert changelist_ids(response) == {jobs[name].id for name in expected}


def test_job_search_by_id(op_client, jobs):
    job = jobs["dead"]
    response = op_client.get(reverse("admin:jobqueue_job_changelist"), {"q": str(job.id)})
    assert changelist_ids(response) == {job.id}


def test_job_detail_shows_claim_timeline_and_context_keys(op_client, jobs):
    job = jobs["stuck"]
    html = op_client.get(reverse("admin:jobqueue_job_change", args=[job.pk])).content.decode()
    assert "<code>api_password</code>" in html  # the key, never the value
    assert "expired 30\xa0seconds ago" in html or "expired 31\xa0seconds ago" in html
    assert "jq-timeline" in html and "claimed" in html and "created" in html
    assert "10 s, doubled per attempt" in html  # the retry backoff (the default)
    # Read-only: no save button, no editable field.
    assert 'name="_save"' not in html
    assert 'name="status"' not in html
    # The fencing token is never rendered.
    job.refresh_from_db()
    assert str(job.last_claim_id) not in html and job.last_claim_id.hex not in html


def test_job_cannot_be_added_deleted_or_edited(op_client, jobs):
    job = jobs["queued"]
    assert op_client.get(reverse("admin:jobqueue_job_add")).status_code == 403
    assert op_client.get(reverse("admin:jobqueue_job_delete", args=[job.pk])).status_code == 403
    response = op_client.post(
        reverse("admin:jobqueue_job_change", args=[job.pk]), {"status": "successful"}
    )
    assert response.status_code == 403
    job.refresh_from_db()
    assert job.status == states.QUEUED


def test_agent_health_columns(op_client, jobs, agent):
    response = op_client.get(reverse("admin:jobqueue_jobagent_changelist"))
    row = next(a for a in response.context["cl"].result_list if a.pk == agent.pk)
    assert row.jobs_in_flight == 2  # healthy + stuck
    assert row.leases_expired_24h == 1  # the dead job's lease
    html = response.content.decode()
    assert "never" in html  # last seen: the agent never called the API in this test
    assert row.online is False and "column-online" in html


def test_presence_shows_on_the_agent_and_its_tokens(op_client, agent):
    """An agent seen a moment ago is online (the database's clock); its token's last use
    shows on the token's page and in the agent's credentials."""
    from agents import credentials
    from agents.models import AgentToken
    from jobqueue.db import NowPlusSeconds
    from jobqueue.models import JobAgent

    token, _ = credentials.create_agent_token(agent)
    JobAgent.objects.filter(pk=agent.pk).update(last_seen_at=NowPlusSeconds(-5))
    AgentToken.objects.filter(pk=token.pk).update(last_used_at=NowPlusSeconds(-5))
    listed = op_client.get(reverse("admin:jobqueue_jobagent_changelist"))
    row = next(a for a in listed.context["cl"].result_list if a.pk == agent.pk)
    assert row.online is True
    assert 'alt="True"' in listed.content.decode()
    page = op_client.get(reverse("admin:jobqueue_jobagent_change", args=[agent.pk]))
    assert "Last used at" in page.content.decode()
    token_page = op_client.get(reverse("admin:agents_agenttoken_change", args=[token.pk]))
    assert "Last used at" in token_page.content.decode()
    assert "Expires at" in token_page.content.decode()
    tokens = op_client.get(reverse("admin:agents_agenttoken_changelist"))
    assert "column-last_used_at" in tokens.content.decode()
    assert "column-expires_at" in tokens.content.decode()
    # An expired token is no longer active, though not revoked.
    expired, _ = credentials.create_agent_token(agent, name="old", ttl_seconds=60)
    AgentToken.objects.filter(pk=expired.pk).update(expires_at=NowPlusSeconds(-1))
    rows = {t.pk: t for t in op_client.get(reverse("admin:agents_agenttoken_changelist"))
            .context["cl"].result_list}
    assert rows[expired.pk].expired is True and rows[token.pk].expired is False


def test_agent_form_rejects_a_lease_out_of_bounds(op_client, agent):
    response = op_client.post(
        reverse("admin:jobqueue_jobagent_add"),
        {"workspace": agent.workspace_id, "name": "too-long", "lease_seconds": 999999,
         "tokens-TOTAL_FORMS": 0, "tokens-INITIAL_FORMS": 0},
    )
    assert response.status_code == 200
    assert "lease_seconds must be an integer from" in response.content.decode()
    assert not agent.workspace.job_agents.filter(name="too-long").exists()


def test_agent_can_be_created_in_the_admin(op_client, agent):
    response = op_client.post(
        reverse("admin:jobqueue_jobagent_add"),
        {"workspace": agent.workspace_id, "name": "new-agent", "lease_seconds": 30,
         "tokens-TOTAL_FORMS": 0, "tokens-INITIAL_FORMS": 0},
    )
    assert response.status_code == 302
    assert agent.workspace.job_agents.get(name="new-agent").effective_lease_seconds == 30


def test_reaper_runs_are_read_only(op_client, jobs):
    run = ReaperRun.objects.first()
    url = reverse("admin:jobqueue_reaperrun_change", args=[run.pk])
    html = op_client.get(url).content.decode()
    assert 'name="_save"' not in html
    assert op_client.post(url, {"requeued": 99}).status_code == 403
    run.refresh_from_db()
    assert run.requeued == 0 and run.expired == 1


def test_list_pages_do_not_load_dispatch_context(op_client, jobs, django_assert_max_num_queries):
    # A changelist with many jobs stays a bounded number of queries.
    agent = JobAgentFactory()
    for _ in range(30):
        Job.objects.create(workspace=agent.workspace, job_agent=agent, max_attempts=1,
                           initial_max_attempts=1)
    with django_assert_max_num_queries(12):
        assert op_client.get(reverse("admin:jobqueue_job_changelist")).status_code == 200


@pytest.mark.parametrize("model", ["workspace", "jobagent"])
def test_workspace_and_agent_search_by_name_or_id(op_client, agent, model):
    obj = agent.workspace if model == "workspace" else agent
    url = reverse(f"admin:jobqueue_{model}_changelist")
    assert changelist_ids(op_client.get(url, {"q": obj.name[-3:]})) == {obj.pk}
    assert changelist_ids(op_client.get(url, {"q": str(obj.pk)})) == {obj.pk}
    assert changelist_ids(op_client.get(url, {"q": "zz-not-a-uuid-zz"})) == set()


def test_agent_form_rejects_a_runtime_out_of_bounds(op_client, agent):
    response = op_client.post(
        reverse("admin:jobqueue_jobagent_add"),
        {"workspace": agent.workspace_id, "name": "timed", "max_runtime_seconds": 10**7,
         "tokens-TOTAL_FORMS": 0, "tokens-INITIAL_FORMS": 0},
    )
    assert response.status_code == 200
    assert "max_runtime_seconds must be an integer from" in response.content.decode()
    assert not agent.workspace.job_agents.filter(name="timed").exists()


def test_job_page_shows_the_clocks_and_the_attempts_deadline(op_client, agent):
    import datetime as dt

    from jobqueue import lifecycle
    from jobqueue.db import db_now

    expires = db_now() + dt.timedelta(hours=2)
    job, _ = lifecycle.create_job(workspace=agent.workspace, job_agent=agent,
                                  max_runtime_seconds=90, expires_at=expires,
                                  retry_backoff_seconds=4)
    lifecycle.claim_job(agent, job.id)
    html = op_client.get(reverse("admin:jobqueue_job_change", args=[job.pk])).content.decode()
    assert "Max runtime seconds" in html and ">90<" in html
    assert "Expires at" in html and "4 s, doubled per attempt" in html
    assert "the lease never runs past it" in html
    # The attempts, derived from the timeline: one, still running, and who claimed it.
    assert 'class="jq-attempts"' in html and "<td>running</td>" in html
    assert f"agent:{agent.id}" in html
    fresh, _ = lifecycle.create_job(workspace=agent.workspace, job_agent=agent)
    html = op_client.get(reverse("admin:jobqueue_job_change", args=[fresh.pk])).content.decode()
    assert "Never claimed." in html


def test_job_page_shows_the_unique_key_and_a_replace_without_the_context(op_client, agent):
    from jobqueue import lifecycle

    job, _ = lifecycle.create_job(workspace=agent.workspace, job_agent=agent,
                                  unique_key="nightly-report",
                                  dispatch_context={"token": "first-secret"})
    lifecycle.create_job(workspace=agent.workspace, job_agent=agent, unique_key="nightly-report",
                         on_conflict="replace", dispatch_context={"token": "second-secret"})
    html = op_client.get(reverse("admin:jobqueue_job_change", args=[job.pk])).content.decode()
    assert "Unique key" in html and "nightly-report" in html
    assert "replaced" in html  # the timeline
    assert "secret" not in html
    listing = op_client.get(reverse("admin:jobqueue_job_changelist")).content.decode()
    assert "secret" not in listing


def test_job_page_shows_dependencies_and_dependents_read_only(op_client, agent):
    from jobqueue import lifecycle

    parent, _ = lifecycle.create_job(workspace=agent.workspace, job_agent=agent)
    child, _ = lifecycle.create_job(workspace=agent.workspace, job_agent=agent,
                                    depends_on=[parent.id])
    html = op_client.get(reverse("admin:jobqueue_job_change", args=[child.pk])).content.decode()
    assert "Depends on" in html and str(parent.id) in html and "waiting on it" in html
    html = op_client.get(reverse("admin:jobqueue_job_change", args=[parent.pk])).content.decode()
    assert "Dependents" in html and str(child.id) in html and "No dependencies." in html
    plain, _ = lifecycle.create_job(workspace=agent.workspace, job_agent=agent)
    html = op_client.get(reverse("admin:jobqueue_job_change", args=[plain.pk])).content.decode()
    assert "No dependencies." in html and "No dependents." in html
