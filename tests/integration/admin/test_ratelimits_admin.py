"""Rate limits in the admin (jobqueue/admin/ratelimits.py): the Rate limits page, the job list's
key column, filters and search, the job page's key (live too), and the limits themselves: added,
changed and deleted through jobqueue.lifecycle.ratelimits (which gives the key's permits out),
checked by the API's rules. Jobs are held back by the real triggers (a limit of 1 claim an hour,
one job of the key claimed)."""

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse

from jobqueue import lifecycle
from jobqueue.admin import ratelimits as admin_ratelimits
from jobqueue.db import NowPlusSeconds
from jobqueue.lifecycle import ratelimits
from jobqueue.models import Job, RateLimit
from tests.factories import JobAgentFactory, JobFactory

from .conftest import SECRET
from .test_live_job import live_url, readonly

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:jobqueue_job_changelist"
PAGE = "admin:jobqueue_job_ratelimits"
LIMITS = "admin:jobqueue_ratelimit_changelist"


@pytest.fixture
def limited():
    agent = JobAgentFactory(workspace__name="acme")
    ws = agent.workspace_id
    ratelimits.set_limit(ws, "api", 1, 3600)
    ratelimits.set_limit(ws, "web", 5, 60)
    claimed = JobFactory(job_agent=agent, rate_limit_key="api", dispatch_context={"p": SECRET})
    assert [g.job.id for g in lifecycle.claim_next(agent, limit=1)] == [claimed.id]
    elsewhere = JobAgentFactory()
    ratelimits.set_limit(elsewhere.workspace_id, "api", 1, 60)
    jobs = {
        "claimed": claimed,
        "held": [JobFactory(job_agent=agent, rate_limit_key="api",
                            dispatch_context={"p": SECRET}) for _ in range(2)],
        "web": JobFactory(job_agent=agent, rate_limit_key="web", in_progress=True),
        "nolimit": JobFactory(job_agent=agent, rate_limit_key="free"),
        "plain": JobFactory(job_agent=agent),
        "elsewhere": JobFactory(job_agent=elsewhere, rate_limit_key="api", in_progress=True),
    }
    assert {Job.objects.get(id=j.id).rate_held for j in jobs["held"]} == {True}
    return agent, jobs


def ids(response) -> set:
    assert response.status_code == 200
    return {obj.pk for obj in response.context["cl"].result_list}


def test_the_page_lists_the_keys_the_most_held_back_first(op_client, limited):
    agent, jobs = limited
    response = op_client.get(reverse(PAGE))
    assert response.status_code == 200
    html = response.content.decode()
    assert "acme" in html and "<code>api</code>" in html and "<code>web</code>" in html
    assert SECRET not in html
    rows = response.context["rows"]
    assert len(rows) == 3  # "free" has no limit: it limits nothing
    first = rows[0]
    assert (first["workspace"], first["key"], first["count"], first["period_seconds"],
            first["claimed"], first["permitted"], first["held"]) == (
        "acme", "api", 1, 3600, 1, 0, 2)
    assert sorted((r["key"], r["count"], r["claimed"], r["held"]) for r in rows[1:]) == [
        ("api", 1, 1, 0), ("web", 5, 1, 0)]
    assert "1 / 3600 s" in html
    # Each key links its jobs (one workspace's key), and its held-back jobs.
    assert ids(op_client.get(first["jobs_url"])) == {jobs["claimed"].id} | {
        j.id for j in jobs["held"]}
    assert ids(op_client.get(first["held_url"])) == {j.id for j in jobs["held"]}
    assert reverse(LIMITS) in html
    # Linked from the job list.
    assert reverse(PAGE) in op_client.get(reverse(CHANGELIST)).content.decode()


def test_the_page_with_no_key_says_so(op_client):
    JobFactory()
    html = op_client.get(reverse(PAGE)).content.decode()
    assert "No job with a rate limit key was claimed in its window or is held back." in html


def test_the_page_needs_the_view_permission_on_jobs(client, viewer, limited):
    client.force_login(viewer)
    assert reverse(LIMITS) in client.get(reverse(PAGE)).content.decode()
    viewer.user_permissions.remove(Permission.objects.get(codename="view_ratelimit"))
    response = client.get(reverse(PAGE))
    assert response.status_code == 200 and reverse(LIMITS) not in response.content.decode()
    viewer.user_permissions.remove(Permission.objects.get(codename="view_job"))
    assert client.get(reverse(PAGE)).status_code == 403


@pytest.mark.parametrize("query, expected", [
    ({"rate_limit": "keyed"}, {"claimed", "held", "web", "nolimit", "elsewhere"}),
    ({"rate_limit": "held"}, {"held"}),
    ({"rate_limit": "none"}, {"plain"}),
    ({"rate_limit_key": "web"}, {"web"}),
    ({"q": "web"}, {"web"}),
    ({"q": "api"}, {"claimed", "held", "elsewhere"}),
])
def test_the_job_list_filters_and_finds_by_key(op_client, limited, query, expected):
    _, jobs = limited
    want = set()
    for name in expected:
        want |= {j.id for j in jobs[name]} if isinstance(jobs[name], list) else {jobs[name].id}
    assert ids(op_client.get(reverse(CHANGELIST), query)) == want


def test_the_job_list_and_page_show_the_key_and_whether_it_holds_the_job_back(op_client,
                                                                            limited):
    agent, jobs = limited
    html = op_client.get(reverse(CHANGELIST)).content.decode()
    assert "<code>api</code> <strong" in html and "<code>web</code><" in html
    assert SECRET not in html
    held = jobs["held"][0]
    page = op_client.get(reverse("admin:jobqueue_job_change", args=[held.pk])).content.decode()
    field = readonly(page, "rate_limit_display")
    assert "<code>api</code>: at most 1 " in field and "3600 s" in field and "Held back" in field
    # Live: the page's field moves when a permit is given to it (the window passed).
    Job.objects.filter(id=jobs["claimed"].id).update(started_at=NowPlusSeconds(-3601))
    ratelimits.settle_key(agent.workspace_id, "api")
    live = op_client.get(live_url(held)).json()["fields"]["rate_limit_display"]
    assert "api" in live and "Held back" not in live
    for name, says in (("plain", "No rate limit key."), ("nolimit", "no limit set")):
        page = op_client.get(reverse("admin:jobqueue_job_change",
                                     args=[jobs[name].pk])).content.decode()
        assert says in readonly(page, "rate_limit_display")


# --- the limits -----------------------------------------------------------------------------


@pytest.fixture
def spied(monkeypatch):
    """The admin's calls of set_limit and delete_limit (which still do their work)."""
    calls = []
    for name in ("set_limit", "delete_limit"):
        real = getattr(ratelimits, name)

        def spy(*args, _real=real, _name=name):
            calls.append((_name, *args))
            return _real(*args)

        monkeypatch.setattr(admin_ratelimits.ratelimits, name, spy)
    return calls


def _form(workspace_id, key, count, period) -> dict:
    return {"workspace": str(workspace_id), "key": key, "count": count,
            "period_seconds": period, "_save": "Save"}


def test_the_limits_list_shows_each_limit_with_its_window(op_client, limited):
    agent, _ = limited
    response = op_client.get(reverse(LIMITS))
    assert response.status_code == 200
    html = response.content.decode()
    assert "1 / 3600 s" in html and "5 / 60 s" in html and SECRET not in html
    found = {(r.workspace_id, r.key): (r.claimed, r.permitted, r.held)
             for r in response.context["cl"].result_list}
    assert found[(agent.workspace_id, "api")] == (1, 0, 2)
    assert found[(agent.workspace_id, "web")] == (1, 0, 0)
    response = op_client.get(reverse(LIMITS), {"q": "web"})
    assert [r.key for r in response.context["cl"].result_list] == ["web"]


def test_adding_a_limit_goes_through_set_limit(op_client, spied):
    agent = JobAgentFactory()
    ws = agent.workspace_id
    JobFactory(job_agent=agent, rate_limit_key="new", in_progress=True)
    queued = JobFactory(job_agent=agent, rate_limit_key="new")
    assert op_client.get(reverse("admin:jobqueue_ratelimit_add")).status_code == 200
    response = op_client.post(reverse("admin:jobqueue_ratelimit_add"), _form(ws, "new", 1, 60))
    assert response.status_code == 302, response.content.decode()[:2000]
    assert spied == [("set_limit", agent.workspace_id, "new", 1, 60)]
    limit = RateLimit.objects.get(workspace_id=ws, key="new")
    assert (limit.count, limit.period_seconds) == (1, 60)
    # The key's permits are dealt again: the running job's claim fills the window, so the
    # queued job gives its permit back, as the next job of the key is held back.
    assert Job.objects.get(id=queued.id).rate_held is True
    after = JobFactory(job_agent=agent, rate_limit_key="new")
    assert Job.objects.get(id=after.id).rate_held is True


@pytest.mark.parametrize("key, count, period, field, says", [
    ("k", 0, 60, "count", "count must be an integer from 1 to 100000"),
    ("k", 100001, 60, "count", "count must be an integer from 1 to 100000"),
    ("k", 1, 0, "period_seconds", "period_seconds must be an integer from 1 to 86400"),
    ("k", 1, 86401, "period_seconds", "period_seconds must be an integer from 1 to 86400"),
    ("bell\x07", 1, 60, "key", "key must be 1 to 255 printable characters"),
    ("x" * 256, 1, 60, "key", "at most 255 characters"),
    ("dup", 1, 60, "__all__", "already exists"),
    ("k", "", 60, "count", "required"),
])
def test_a_limit_the_api_would_refuse_is_refused(op_client, spied, key, count, period, field,
                                                 says):
    agent = JobAgentFactory()
    ratelimits.set_limit(agent.workspace_id, "dup", 2, 10)
    spied.clear()
    response = op_client.post(reverse("admin:jobqueue_ratelimit_add"),
                              _form(agent.workspace_id, key, count, period))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert says in " ".join(errors.get(field, [])), errors
    assert spied == []
    assert list(RateLimit.objects.values_list("key", "count")) == [("dup", 2)]


def test_changing_a_limit_goes_through_set_limit_and_gives_permits_out(op_client, limited,
                                                                       spied):
    agent, jobs = limited
    limit = RateLimit.objects.get(workspace_id=agent.workspace_id, key="api")
    url = reverse("admin:jobqueue_ratelimit_change", args=[limit.pk])
    page = op_client.get(url)
    assert page.status_code == 200 and SECRET not in page.content.decode()
    # The workspace and the key are the limit's: the form changes count and period only.
    response = op_client.post(url, {"count": 3, "period_seconds": 3600, "_save": "Save",
                                    "key": "other", "workspace": "x"})
    assert response.status_code == 302, response.content.decode()[:2000]
    assert spied == [("set_limit", agent.workspace_id, "api", 3, 3600)]
    limit.refresh_from_db()
    assert (limit.key, limit.count, limit.period_seconds) == ("api", 3, 3600)
    # Raised from 1 to 3: the two held-back jobs were given the permits it frees.
    assert {Job.objects.get(id=j.id).rate_held for j in jobs["held"]} == {None}
    response = op_client.post(url, {"count": 0, "period_seconds": 3600, "_save": "Save"})
    assert response.status_code == 200 and len(spied) == 1


def test_deleting_a_limit_goes_through_delete_limit(op_client, limited, spied):
    agent, jobs = limited
    limit = RateLimit.objects.get(workspace_id=agent.workspace_id, key="api")
    url = reverse("admin:jobqueue_ratelimit_delete", args=[limit.pk])
    assert op_client.get(url).status_code == 200
    assert op_client.post(url, {"post": "yes"}).status_code == 302
    assert spied == [("delete_limit", agent.workspace_id, "api")]
    assert not RateLimit.objects.filter(id=limit.id).exists()
    # A key without a limit limits nothing: its held-back jobs were given permits.
    assert {Job.objects.get(id=j.id).rate_held for j in jobs["held"]} == {None}


def test_the_delete_action_goes_through_delete_limit(op_client, limited, spied):
    agent, _ = limited
    chosen = list(RateLimit.objects.filter(workspace_id=agent.workspace_id)
                  .order_by("key").values_list("pk", "key"))
    response = op_client.post(reverse(LIMITS), {
        "action": "delete_selected", "_selected_action": [pk for pk, _ in chosen],
        "post": "yes"})
    assert response.status_code == 302
    assert sorted(spied) == [("delete_limit", agent.workspace_id, key) for _, key in chosen]
    assert not RateLimit.objects.filter(workspace_id=agent.workspace_id).exists()
    assert Job.objects.filter(rate_held=True).count() == 0


def test_view_only_staff_see_the_limits_and_change_nothing(viewer_client, limited, spied):
    agent, _ = limited
    limit = RateLimit.objects.get(workspace_id=agent.workspace_id, key="api")
    assert viewer_client.get(reverse(LIMITS)).status_code == 200
    url = reverse("admin:jobqueue_ratelimit_change", args=[limit.pk])
    assert viewer_client.get(url).status_code == 200
    assert viewer_client.post(url, {"count": 9, "period_seconds": 9}).status_code == 403
    assert viewer_client.get(reverse("admin:jobqueue_ratelimit_add")).status_code == 403
    assert viewer_client.post(reverse("admin:jobqueue_ratelimit_delete", args=[limit.pk]),
                              {"post": "yes"}).status_code == 403
    assert spied == [] and RateLimit.objects.get(id=limit.id).count == 1
