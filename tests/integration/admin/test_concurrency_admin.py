"""Concurrency keys in the admin (jobqueue/admin/concurrency.py): the Concurrency keys page,
the job list's key column, filters and search, the job page's key (live too). The held state is
set as the key's triggers set it (concurrency_held: the key's slots keep the queued job back)."""

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse

from jobqueue.models import Job
from tests.factories import JobAgentFactory, JobFactory

from .test_live_job import live_url, readonly

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:jobqueue_job_changelist"
PAGE = "admin:jobqueue_job_concurrency"


@pytest.fixture
def keyed():
    agent = JobAgentFactory(workspace__name="acme")
    jobs = {
        "running": JobFactory(job_agent=agent, concurrency_key="tenant-1", concurrency_limit=1,
                              in_progress=True),
        "held": [JobFactory(job_agent=agent, concurrency_key="tenant-1", concurrency_limit=1)
                 for _ in range(2)],
        "other": JobFactory(job_agent=agent, concurrency_key="tenant-2", concurrency_limit=3,
                            in_progress=True),
        "plain": JobFactory(job_agent=agent),
        "elsewhere": JobFactory(concurrency_key="tenant-1", concurrency_limit=1,
                                in_progress=True),
    }
    Job.objects.filter(id__in=[j.id for j in jobs["held"]]).update(concurrency_held=True)
    return agent, jobs


def ids(response) -> set:
    assert response.status_code == 200
    return {obj.pk for obj in response.context["cl"].result_list}


def test_the_page_lists_the_keys_the_most_held_back_first(op_client, keyed):
    agent, jobs = keyed
    response = op_client.get(reverse(PAGE))
    assert response.status_code == 200
    html = response.content.decode()
    assert "acme" in html and "<code>tenant-1</code>" in html and "<code>tenant-2</code>" in html
    assert len(response.context["rows"]) == 3  # the plain job's key: none
    first = response.context["rows"][0]
    assert (first["workspace"], first["key"], first["running"], first["limit"],
            first["waiting"], first["held"]) == ("acme", "tenant-1", 1, 1, 0, 2)
    assert [(r["key"], r["running"], r["held"]) for r in response.context["rows"][1:]] in (
        [("tenant-1", 1, 0), ("tenant-2", 1, 0)], [("tenant-2", 1, 0), ("tenant-1", 1, 0)])
    # Each key links its jobs (one workspace's key), and its held-back jobs.
    assert ids(op_client.get(first["jobs_url"])) == {jobs["running"].id} | {
        j.id for j in jobs["held"]}
    assert ids(op_client.get(first["held_url"])) == {j.id for j in jobs["held"]}
    assert ids(op_client.get(first["running_url"])) == {jobs["running"].id}
    # Linked from the job list.
    assert reverse(PAGE) in op_client.get(reverse(CHANGELIST)).content.decode()


def test_the_page_with_no_key_says_so(op_client):
    JobFactory()
    html = op_client.get(reverse(PAGE)).content.decode()
    assert "No job with a concurrency key is in progress or held back." in html


def test_the_page_needs_the_view_permission_on_jobs(client, viewer, keyed):
    client.force_login(viewer)
    assert client.get(reverse(PAGE)).status_code == 200
    viewer.user_permissions.remove(Permission.objects.get(codename="view_job"))
    assert client.get(reverse(PAGE)).status_code == 403


@pytest.mark.parametrize("query, expected", [
    ({"concurrency": "keyed"}, {"running", "held", "other", "elsewhere"}),
    ({"concurrency": "held"}, {"held"}),
    ({"concurrency": "none"}, {"plain"}),
    ({"concurrency_key": "tenant-2"}, {"other"}),
    ({"q": "tenant-2"}, {"other"}),
])
def test_the_job_list_filters_and_finds_by_key(op_client, keyed, query, expected):
    _, jobs = keyed
    want = set()
    for name in expected:
        want |= {j.id for j in jobs[name]} if isinstance(jobs[name], list) else {jobs[name].id}
    assert ids(op_client.get(reverse(CHANGELIST), query)) == want


def test_the_job_list_and_page_show_the_key_and_whether_it_holds_the_job_back(op_client, keyed):
    _, jobs = keyed
    html = op_client.get(reverse(CHANGELIST)).content.decode()
    assert "<code>tenant-1</code> ≤ 1 <strong" in html and "held back" in html
    assert "<code>tenant-2</code> ≤ 3<" in html
    held = jobs["held"][0]
    page = op_client.get(reverse("admin:jobqueue_job_change", args=[held.pk])).content.decode()
    field = readonly(page, "concurrency_display")
    assert "<code>tenant-1</code>: at most 1 " in field and "Held back" in field
    # Live: the page's field moves when a slot is given to it.
    Job.objects.filter(id=held.id).update(concurrency_held=None)
    live = op_client.get(live_url(held)).json()["fields"]["concurrency_display"]
    assert "tenant-1" in live and "Held back" not in live
    plain = jobs["plain"]
    page = op_client.get(reverse("admin:jobqueue_job_change", args=[plain.pk])).content.decode()
    assert readonly(page, "concurrency_display").strip() == "No concurrency key."
