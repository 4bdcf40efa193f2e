"""Secrets never reach admin HTML; credentials are shown once and can be revoked."""

import pytest
from django.contrib.admin.models import LogEntry
from django.urls import reverse

from agents import credentials
from agents.models import AgentToken, WorkspaceApiKey
from tests.factories import JobFactory

from .conftest import SECRET
from .test_actions import run_action

pytestmark = pytest.mark.django_db


def test_dispatch_context_secret_never_appears_in_admin_html(op_client, jobs):
    # Give every job some history first, so that history pages have entries.
    run_action(op_client, "requeue_jobs", jobs["dead"])
    run_action(op_client, "cancel_jobs", jobs["queued"])
    op_client.post(reverse("admin:jobqueue_job_reap"))
    pages = [
        reverse("admin:jobqueue_job_changelist"),
        reverse("admin:jobqueue_job_changelist") + "?lease=expired",
        reverse("admin:jobqueue_job_recovery"),
        reverse("admin:jobqueue_job_reap"),
        reverse("admin:index"),  # recent actions
    ]
    for job in jobs.values():
        pages.append(reverse("admin:jobqueue_job_change", args=[job.pk]))
        pages.append(reverse("admin:jobqueue_job_history", args=[job.pk]))
    for url in pages:
        response = op_client.get(url)
        assert response.status_code == 200, url
        assert SECRET not in response.content.decode(), url
    # Search does not look into dispatch_context (the term itself is echoed in the box).
    found = op_client.get(reverse("admin:jobqueue_job_changelist"), {"q": SECRET})
    assert list(found.context["cl"].result_list) == []
    # Nor in any log entry.
    assert not any(SECRET in str(e.change_message) for e in LogEntry.objects.all())


def test_issue_an_agent_token_shown_once(op_client, agent):
    url = reverse("admin:agents_agenttoken_add")
    form = op_client.get(url + f"?job_agent={agent.pk}").content.decode()
    assert f'value="{agent.pk}" selected' in form
    response = op_client.post(url, {"job_agent": agent.pk, "name": "ci-runner"})
    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    raw = response.context["secret"]
    assert raw.startswith("jqa_") and raw in response.content.decode()
    token = credentials.resolve_agent_token(raw)
    assert token is not None and token.job_agent_id == agent.pk and token.name == "ci-runner"
    # Stored hashed: nothing shows it again.
    assert raw not in token.secret_hash
    for page in [
        reverse("admin:agents_agenttoken_changelist"),
        reverse("admin:agents_agenttoken_change", args=[token.pk]),
        reverse("admin:agents_agenttoken_history", args=[token.pk]),
        reverse("admin:jobqueue_jobagent_change", args=[agent.pk]),
        reverse("admin:index"),
    ]:
        html = op_client.get(page).content.decode()
        assert raw not in html, page
        assert raw.split("_", 2)[2] not in html, page  # the secret (it may hold "_")
    assert token.prefix in op_client.get(
        reverse("admin:jobqueue_jobagent_change", args=[agent.pk])
    ).content.decode()
    log = LogEntry.objects.get(object_id=str(token.pk))
    assert "Issued by operator:olga" in log.get_change_message()
    assert raw not in log.get_change_message()


def test_issue_requires_an_agent(op_client):
    response = op_client.post(reverse("admin:agents_agenttoken_add"), {"name": "x"})
    assert response.status_code == 200 and "This field is required" in response.content.decode()
    assert not AgentToken.objects.exists()


def test_revoke_agent_token(op_client, agent):
    token, raw = credentials.create_agent_token(agent)
    response = op_client.post(
        reverse("admin:agents_agenttoken_changelist"),
        {"action": "revoke_selected", "_selected_action": [str(token.pk)], "index": 0},
        follow=True,
    )
    assert "Revoked 1 credential(s)." in response.content.decode()
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert credentials.resolve_agent_token(raw) is None
    assert "Revoked by operator:olga" in LogEntry.objects.get(
        object_id=str(token.pk)
    ).get_change_message()
    active = op_client.get(reverse("admin:agents_agenttoken_changelist") + "?state=active")
    assert list(active.context["cl"].result_list) == []
    revoked = op_client.get(reverse("admin:agents_agenttoken_changelist") + "?state=revoked")
    assert list(revoked.context["cl"].result_list) == [token]


def test_issue_and_revoke_workspace_api_key(op_client, agent):
    response = op_client.post(
        reverse("admin:agents_workspaceapikey_add"),
        {"workspace": agent.workspace_id, "name": "producer"},
    )
    raw = response.context["secret"]
    key = credentials.resolve_api_key(raw)
    assert key.workspace_id == agent.workspace_id
    op_client.post(
        reverse("admin:agents_workspaceapikey_changelist"),
        {"action": "revoke_selected", "_selected_action": [str(key.pk)], "index": 0},
    )
    assert credentials.resolve_api_key(raw) is None


def test_view_only_staff_cannot_issue_or_revoke(viewer_client, agent):
    token, raw = credentials.create_agent_token(agent)
    assert viewer_client.get(reverse("admin:agents_agenttoken_add")).status_code == 403
    response = viewer_client.post(
        reverse("admin:agents_agenttoken_add"), {"job_agent": agent.pk, "name": "sneaky"}
    )
    assert response.status_code == 403
    assert AgentToken.objects.count() == 1
    viewer_client.post(
        reverse("admin:agents_agenttoken_changelist"),
        {"action": "revoke_selected", "_selected_action": [str(token.pk)], "index": 0},
    )
    assert credentials.resolve_agent_token(raw) is not None
    assert viewer_client.get(reverse("admin:agents_workspaceapikey_add")).status_code == 403
    assert not WorkspaceApiKey.objects.exists()


def test_issue_form_names_agents_with_their_workspace(op_client, agent):
    html = op_client.get(reverse("admin:agents_agenttoken_add")).content.decode()
    assert f"{agent.workspace.name} / {agent.name}" in html


@pytest.mark.parametrize(
    "url",
    [
        "/admin/jobqueue/job/?dispatch_context__api_key__startswith=h",
        "/admin/jobqueue/job/?dispatch_context__icontains=hunter",
        "/admin/jobqueue/job/?last_claim_id__isnull=False",
        "/admin/jobqueue/job/?idempotency_fingerprint__startswith=a",
        "/admin/jobqueue/jobagent/?jobs__dispatch_context__api_key__startswith=h",
        "/admin/agents/agenttoken/?secret_hash__startswith=a",
        "/admin/agents/workspaceapikey/?secret_hash__startswith=a",
        "/admin/agents/registrationtoken/?secret_hash__startswith=a",
        "/admin/jobqueue/webhookendpoint/?secret__regex=%5Ewhsec_",
        "/admin/jobqueue/schedule/?job__dispatch_context__api_key__startswith=h",
        "/admin/jobqueue/job/?message__regex=hunter",
        "/admin/jobqueue/job/?result__echo__regex=hunter",
        "/admin/jobqueue/webhookdelivery/?payload__job__message__regex=hunter",
    ],
)
def test_query_string_cannot_probe_secrets(viewer_client, url):
    """A filter on dispatch_context (or a token or hash) would be a guessing oracle: each
    guess answering "1 result" or "0 results". The admin refuses such lookups outright."""
    JobFactory(dispatch_context={"api_key": SECRET})
    response = viewer_client.get(url)
    assert response.status_code == 400
    assert SECRET.encode() not in response.content


def test_no_admin_list_filters_by_a_field_its_page_does_not_offer(viewer_client):
    """Django allows a lookup on any of a model's own fields: `?secret__regex=^whsec_a` on
    the webhook endpoints, a JSON path into a schedule's `job` (its dispatch_context),
    `?message__regex=` on jobs (text the pages redact) would each read a secret out one
    character at a time from the row count. Every admin of ours refuses a lookup on a field
    its list_filter does not offer, and keeps the ones it does."""
    from django.contrib import admin

    JobFactory(dispatch_context={"api_key": SECRET})
    checked = 0
    for model, model_admin in admin.site._registry.items():
        if model._meta.app_label not in ("jobqueue", "agents"):
            continue
        url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
        offered = {(f[0] if isinstance(f, tuple) else f).split("__")[0]
                   for f in model_admin.list_filter if not isinstance(f, type)}
        for field in model._meta.concrete_fields:
            name = field.name
            lookup = (f"{name}__isnull" if field.is_relation
                      else f"{name}__regex" if field.get_internal_type() in (
                          "CharField", "TextField") else f"{name}__isnull")
            r = viewer_client.get(url, {lookup: "^x" if lookup.endswith("regex") else "True"})
            assert r.status_code == (200 if name in offered else 400), (url, lookup)
            checked += 1
    assert checked > 100
    # The filters the pages link to still work.
    for url in ("/admin/jobqueue/job/?status__exact=queued",
                "/admin/jobqueue/job/?group=run-1&lease=expired",
                "/admin/jobqueue/webhookdelivery/?status__exact=pending",
                "/admin/jobqueue/schedule/?paused_at__isempty=1"):
        assert viewer_client.get(url).status_code == 200, url
    # A parameter that is neither a field nor a filter's: Django's own answer (the list
    # again, with ?e=1), never a filter.
    r = viewer_client.get("/admin/jobqueue/job/?nonsense=1")
    assert r.status_code == 302 and r["Location"].endswith("?e=1")


def test_a_dispatch_context_that_is_not_an_object_shows_only_its_type(op_client, agent):
    job = JobFactory(job_agent=agent, dispatch_context=[SECRET])
    html = op_client.get(reverse("admin:jobqueue_job_change", args=[job.pk])).content.decode()
    assert "(list, redacted)" in html and SECRET not in html


def test_registration_tokens_are_listed_and_revoked_never_shown(op_client, agent):
    """The admin lists registration tokens (uses, expiry, labels; masked) and revokes them
    with an action; it issues none (the API shows the secret once) and deletes none."""
    from agents import registration
    from agents.models import RegistrationToken

    row, raw = registration.issue(agent.workspace_id, description="fleet", labels=["gpu"],
                                  max_uses=3)
    registration.register(raw, "runner-1")
    listed = op_client.get(reverse("admin:agents_registrationtoken_changelist"))
    html = listed.content.decode()
    assert listed.status_code == 200 and "fleet" in html and "1 of 3" in html
    assert f"jqr_{row.prefix}_" in html and raw not in html
    page = op_client.get(reverse("admin:agents_registrationtoken_change", args=[row.pk]))
    assert page.status_code == 200 and raw not in page.content.decode()
    assert op_client.get(reverse("admin:agents_registrationtoken_add")).status_code == 403
    response = op_client.post(
        reverse("admin:agents_registrationtoken_changelist"),
        {"action": "revoke_selected", "_selected_action": [str(row.pk)], "index": 0},
        follow=True,
    )
    assert "Revoked 1 registration token(s)." in response.content.decode()
    row.refresh_from_db()
    assert row.revoked_at is not None
    with pytest.raises(registration.RegistrationTokenInvalid):
        registration.register(raw, "runner-2")
    rows = op_client.get(reverse("admin:agents_registrationtoken_changelist")).context[
        "cl"].result_list
    assert [r.pk for r in rows] == [row.pk] and RegistrationToken.objects.count() == 1
    # Filtered by workspace, as its list filter does.
    by_workspace = op_client.get(reverse("admin:agents_registrationtoken_changelist")
                                 + f"?workspace__id__exact={agent.workspace_id}")
    assert [r.pk for r in by_workspace.context["cl"].result_list] == [row.pk]
    # The agent it registered shows its labels.
    registered = op_client.get(reverse("admin:jobqueue_jobagent_changelist") + "?q=runner-1")
    assert "gpu" in registered.content.decode()


def _change_agent(op_client, agent, labels):
    return op_client.post(reverse("admin:jobqueue_jobagent_change", args=[agent.pk]), {
        "name": agent.name, "lease_seconds": agent.lease_seconds or "",
        "max_attempts": agent.max_attempts or "", "max_runtime_seconds": "",
        "labels": labels, "tokens-TOTAL_FORMS": "0", "tokens-INITIAL_FORMS": "0",
        "tokens-MIN_NUM_FORMS": "0", "tokens-MAX_NUM_FORMS": "1000"})


def test_an_operator_changes_an_agents_labels_in_the_admin(op_client, agent):
    page = op_client.get(reverse("admin:jobqueue_jobagent_change", args=[agent.pk]))
    assert 'name="labels"' in page.content.decode()
    r = _change_agent(op_client, agent, "linux, gpu gpu")
    assert r.status_code == 302, r.content.decode()[:3000]
    agent.refresh_from_db()
    assert agent.labels == ["gpu", "linux"]
    page = op_client.get(reverse("admin:jobqueue_jobagent_change", args=[agent.pk]))
    assert 'value="gpu linux"' in page.content.decode()
    # A bad label is the form's error and changes nothing; an empty field clears them.
    r = _change_agent(op_client, agent, "gpu no!")
    assert r.status_code == 200 and "A-Z a-z 0-9" in r.content.decode()
    agent.refresh_from_db()
    assert agent.labels == ["gpu", "linux"]
    assert _change_agent(op_client, agent, "").status_code == 302
    agent.refresh_from_db()
    assert agent.labels == []


def test_a_change_of_an_agent_writes_only_the_fields_the_form_changed(op_client, agent):
    """Not paused_at or last_seen_at as the request read them: a pause committed between
    the page's read and its save would be undone."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        assert _change_agent(op_client, agent, "gpu").status_code == 302
    updates = [q["sql"] for q in queries.captured_queries
               if q["sql"].startswith('UPDATE "job_agent"')]
    assert len(updates) == 1 and '"labels"' in updates[0]
    assert "paused_at" not in updates[0] and "last_seen_at" not in updates[0]
    agent.refresh_from_db()
    assert agent.labels == ["gpu"]
    # Saved again unchanged: nothing is written.
    with CaptureQueriesContext(connection) as queries:
        assert _change_agent(op_client, agent, "gpu").status_code == 302
    assert not [q for q in queries.captured_queries if q["sql"].startswith('UPDATE "job_agent"')]

