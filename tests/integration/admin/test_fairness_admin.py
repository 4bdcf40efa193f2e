"""Fair shares in the admin (jobqueue/admin/fairness.py): the Fair shares page (each key's
weight, queued and running jobs, and its share of the next claims), the job list's key column,
filters and search, the job page's key, and the weights themselves: added, changed and deleted
through jobqueue.lifecycle.fairness (which respaces the key's queued jobs), checked by the API's
rules. Jobs are created by the real lifecycle (each takes its place by its key's weight)."""

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse

from jobqueue import lifecycle
from jobqueue.admin import fairness as admin_fairness
from jobqueue.lifecycle import fairness
from jobqueue.models import FairnessKey, Job
from tests.factories import JobAgentFactory

from .conftest import SECRET
from .test_live_job import readonly

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:jobqueue_job_changelist"
PAGE = "admin:jobqueue_job_fairness"
WEIGHTS = "admin:jobqueue_fairnesskey_changelist"


def _create(agent, key=None, n=1):
    return [lifecycle.create_job(workspace=agent.workspace, job_agent=agent, fairness_key=key,
                                 dispatch_context={"p": SECRET}).job for _ in range(n)]


@pytest.fixture
def fair():
    """acme: "run" has its one job in progress; then "big" (weight 3) 4 queued, "small" (no
    weight) 2 queued, a plain job; another workspace's "big" (weight 1) 1 queued."""
    agent = JobAgentFactory(workspace__name="acme")
    ws = agent.workspace_id
    run = _create(agent, "run")
    assert [g.job.id for g in lifecycle.claim_next(agent, limit=1)] == [run[0].id]
    fairness.set_weight(ws, "big", 3)
    elsewhere = JobAgentFactory()
    fairness.set_weight(elsewhere.workspace_id, "big", 1)
    jobs = {
        "run": run,
        "big": _create(agent, "big", 4),
        "small": _create(agent, "small", 2),
        "plain": _create(agent),
        "elsewhere": _create(elsewhere, "big"),
    }
    return agent, jobs


def ids(response) -> set:
    assert response.status_code == 200
    return {obj.pk for obj in response.context["cl"].result_list}


def test_the_page_lists_the_keys_the_most_queued_first_with_their_shares(op_client, fair):
    agent, jobs = fair
    response = op_client.get(reverse(PAGE))
    assert response.status_code == 200
    html = response.content.decode()
    assert "acme" in html and "<code>big</code>" in html and "<code>small</code>" in html
    assert SECRET not in html and "dispatch" not in html
    rows = response.context["rows"]
    got = [(r["workspace"], r["key"], r["weight"], r["queued"], r["running"], r["share"])
           for r in rows]
    # acme's keys with jobs queued weigh 3 + 1: "big" gets 3/4 of its next claims, "small"
    # 1/4, "run" (nothing queued) none; the other workspace's "big" all of its own.
    assert got[:2] == [("acme", "big", 3, 4, 0, 75.0), ("acme", "small", 1, 2, 0, 25.0)]
    assert got[2][1:] == ("big", 1, 1, 0, 100.0) and got[2][0] != "acme"
    assert got[3] == ("acme", "run", 1, 0, 1, 0.0)
    assert "75.0 %" in html and "25.0 %" in html
    # Each key links its jobs (one workspace's key).
    assert ids(op_client.get(rows[0]["jobs_url"])) == {j.id for j in jobs["big"]}
    assert ids(op_client.get(rows[2]["jobs_url"])) == {j.id for j in jobs["elsewhere"]}
    assert reverse(WEIGHTS) in html
    # Linked from the job list.
    assert reverse(PAGE) in op_client.get(reverse(CHANGELIST)).content.decode()


def test_the_page_lists_at_most_its_rows(op_client, fair, monkeypatch):
    monkeypatch.setattr(admin_fairness, "FAIRNESS_ROWS", 1)
    rows = op_client.get(reverse(PAGE)).context["rows"]
    assert [(r["key"], r["queued"], r["share"]) for r in rows] == [("big", 4, 75.0)]


def test_the_page_with_no_key_says_so(op_client):
    _create(JobAgentFactory())
    html = op_client.get(reverse(PAGE)).content.decode()
    assert "No job with a fairness key is queued or in progress." in html


def test_the_page_needs_the_view_permission_on_jobs(client, viewer, fair):
    client.force_login(viewer)
    assert reverse(WEIGHTS) in client.get(reverse(PAGE)).content.decode()
    viewer.user_permissions.remove(Permission.objects.get(codename="view_fairnesskey"))
    response = client.get(reverse(PAGE))
    assert response.status_code == 200 and reverse(WEIGHTS) not in response.content.decode()
    viewer.user_permissions.remove(Permission.objects.get(codename="view_job"))
    assert client.get(reverse(PAGE)).status_code == 403


@pytest.mark.parametrize("query, expected", [
    ({"fairness": "keyed"}, {"run", "big", "small", "elsewhere"}),
    ({"fairness": "none"}, {"plain"}),
    ({"fairness_key": "small"}, {"small"}),
    ({"q": "small"}, {"small"}),
    ({"q": "big"}, {"big", "elsewhere"}),
])
def test_the_job_list_filters_and_finds_by_key(op_client, fair, query, expected):
    _, jobs = fair
    want = {j.id for name in expected for j in jobs[name]}
    assert ids(op_client.get(reverse(CHANGELIST), query)) == want


def test_the_job_list_and_page_show_the_key_and_its_weight(op_client, fair):
    agent, jobs = fair
    html = op_client.get(reverse(CHANGELIST)).content.decode()
    assert "<code>big</code>" in html and "<code>small</code>" in html
    assert SECRET not in html
    page = op_client.get(reverse("admin:jobqueue_job_change",
                                 args=[jobs["big"][0].pk])).content.decode()
    field = readonly(page, "fairness_display")
    assert "<code>big</code>: weight 3." in field and "fairness_key=big" in field
    assert SECRET not in page
    page = op_client.get(reverse("admin:jobqueue_job_change",
                                 args=[jobs["small"][0].pk])).content.decode()
    assert "weight 1 (none set)" in readonly(page, "fairness_display")
    page = op_client.get(reverse("admin:jobqueue_job_change",
                                 args=[jobs["plain"][0].pk])).content.decode()
    assert "No fairness key." in readonly(page, "fairness_display")


# --- the weights ----------------------------------------------------------------------------


@pytest.fixture
def spied(monkeypatch):
    """The admin's calls of set_weight and delete_weight (which still do their work)."""
    calls = []
    for name in ("set_weight", "delete_weight"):
        real = getattr(fairness, name)

        def spy(*args, _real=real, _name=name):
            calls.append((_name, *args))
            return _real(*args)

        monkeypatch.setattr(admin_fairness.fairness, name, spy)
    return calls


def _form(workspace_id, key, weight) -> dict:
    return {"workspace": str(workspace_id), "key": key, "weight": weight, "_save": "Save"}


def _spacings(workspace_id, key) -> set:
    places = list(Job.objects.filter(workspace_id=workspace_id, fairness_key=key,
                                     status="queued").order_by("fair_at", "created_at")
                  .values_list("fair_at", flat=True))
    return {b - a for a, b in zip(places, places[1:], strict=False)}


def test_the_weights_list_shows_each_weight_with_its_jobs(op_client, fair):
    agent, jobs = fair
    response = op_client.get(reverse(WEIGHTS))
    assert response.status_code == 200
    html = response.content.decode()
    assert SECRET not in html
    found = {(r.workspace_id, r.key): (r.weight, r.queued, r.running)
             for r in response.context["cl"].result_list}
    assert found == {(agent.workspace_id, "big"): (3, 4, 0),
                     (jobs["elsewhere"][0].workspace_id, "big"): (1, 1, 0)}
    assert "fairness_key=big" in html  # the queued count links the key's jobs
    response = op_client.get(reverse(WEIGHTS), {"q": "nope"})
    assert list(response.context["cl"].result_list) == []
    fairness.set_weight(agent.workspace_id, "idle", 2)  # a weight with no job: 0, no link
    response = op_client.get(reverse(WEIGHTS), {"q": "idle"})
    assert [(r.key, r.queued) for r in response.context["cl"].result_list] == [("idle", 0)]
    assert "fairness_key=idle" not in response.content.decode()


def test_adding_a_weight_goes_through_set_weight_and_respaces_the_key(op_client, fair, spied):
    agent, jobs = fair
    ws = agent.workspace_id
    assert _spacings(ws, "small") == {fairness.STEP}
    assert op_client.get(reverse("admin:jobqueue_fairnesskey_add")).status_code == 200
    response = op_client.post(reverse("admin:jobqueue_fairnesskey_add"), _form(ws, "small", 2))
    assert response.status_code == 302, response.content.decode()[:2000]
    assert spied == [("set_weight", ws, "small", 2)]
    assert FairnessKey.objects.get(workspace_id=ws, key="small").weight == 2
    assert _spacings(ws, "small") == {fairness.STEP / 2}


@pytest.mark.parametrize("key, weight, field, says", [
    ("k", 0, "weight", "weight must be an integer from 1 to 100"),
    ("k", 101, "weight", "weight must be an integer from 1 to 100"),
    ("k", "", "weight", "required"),
    ("bell\x07", 1, "key", "key must be 1 to 255 printable characters"),
    ("x" * 256, 1, "key", "at most 255 characters"),
    ("dup", 1, "__all__", "already exists"),
])
def test_a_weight_the_api_would_refuse_is_refused(op_client, spied, key, weight, field, says):
    agent = JobAgentFactory()
    fairness.set_weight(agent.workspace_id, "dup", 2)
    spied.clear()
    response = op_client.post(reverse("admin:jobqueue_fairnesskey_add"),
                              _form(agent.workspace_id, key, weight))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert says in " ".join(errors.get(field, [])), errors
    assert spied == []
    assert list(FairnessKey.objects.values_list("key", "weight")) == [("dup", 2)]


def test_changing_a_weight_goes_through_set_weight(op_client, fair, spied):
    agent, jobs = fair
    ws = agent.workspace_id
    row = FairnessKey.objects.get(workspace_id=ws, key="big")
    url = reverse("admin:jobqueue_fairnesskey_change", args=[row.pk])
    page = op_client.get(url)
    assert page.status_code == 200 and SECRET not in page.content.decode()
    # The workspace and the key are the weight's: the form changes the weight only.
    response = op_client.post(url, {"weight": 4, "_save": "Save", "key": "other",
                                    "workspace": "x"})
    assert response.status_code == 302, response.content.decode()[:2000]
    assert spied == [("set_weight", ws, "big", 4)]
    row.refresh_from_db()
    assert (row.key, row.weight) == ("big", 4)
    assert _spacings(ws, "big") == {fairness.STEP / 4}
    response = op_client.post(url, {"weight": 0, "_save": "Save"})
    assert response.status_code == 200 and len(spied) == 1


def test_deleting_a_weight_goes_through_delete_weight(op_client, fair, spied):
    agent, _ = fair
    ws = agent.workspace_id
    row = FairnessKey.objects.get(workspace_id=ws, key="big")
    url = reverse("admin:jobqueue_fairnesskey_delete", args=[row.pk])
    assert op_client.get(url).status_code == 200
    assert op_client.post(url, {"post": "yes"}).status_code == 302
    assert spied == [("delete_weight", ws, "big")]
    assert not FairnessKey.objects.filter(id=row.id).exists()
    # It weighs 1 again: its queued jobs are spaced so.
    assert _spacings(ws, "big") == {fairness.STEP}


def test_the_delete_action_goes_through_delete_weight(op_client, fair, spied):
    agent, jobs = fair
    fairness.set_weight(agent.workspace_id, "small", 5)
    spied.clear()
    chosen = list(FairnessKey.objects.filter(workspace_id=agent.workspace_id)
                  .order_by("key").values_list("pk", "key"))
    response = op_client.post(reverse(WEIGHTS), {
        "action": "delete_selected", "_selected_action": [pk for pk, _ in chosen],
        "post": "yes"})
    assert response.status_code == 302
    assert sorted(spied) == [("delete_weight", agent.workspace_id, key) for _, key in chosen]
    assert not FairnessKey.objects.filter(workspace_id=agent.workspace_id).exists()
    assert FairnessKey.objects.filter(workspace_id=jobs["elsewhere"][0].workspace_id).exists()


def test_view_only_staff_see_the_weights_and_change_nothing(viewer_client, fair, spied):
    agent, _ = fair
    row = FairnessKey.objects.get(workspace_id=agent.workspace_id, key="big")
    assert viewer_client.get(reverse(WEIGHTS)).status_code == 200
    url = reverse("admin:jobqueue_fairnesskey_change", args=[row.pk])
    assert viewer_client.get(url).status_code == 200
    assert viewer_client.post(url, {"weight": 9}).status_code == 403
    assert viewer_client.get(reverse("admin:jobqueue_fairnesskey_add")).status_code == 403
    assert viewer_client.post(reverse("admin:jobqueue_fairnesskey_delete", args=[row.pk]),
                              {"post": "yes"}).status_code == 403
    assert spied == [] and FairnessKey.objects.get(id=row.id).weight == 3
