"""`manage.py bootstrap_demo` (what `make run` prints): one demo workspace and agent, however
often it runs, and fresh credentials each time that work (the old ones stay valid)."""

import json

import pytest
from django.core.management import call_command

from agents import credentials
from jobqueue.models import JobAgent, Workspace

pytestmark = pytest.mark.django_db


def test_bootstrap_demo_is_idempotent_and_issues_working_credentials(capsys):
    call_command("bootstrap_demo", "--json")
    first = json.loads(capsys.readouterr().out)
    call_command("bootstrap_demo")
    text = capsys.readouterr().out.splitlines()
    assert text[0] == "Demo credentials (shown once; issue more with create_job_agent):"
    second = dict(line.split() for line in text[1:5])
    assert text[5:7] == ["Admin login (/admin/):", "  admin_user    demo-operator"]
    assert text[7].startswith("  password      (shown once, when it was created; reset:")

    assert set(first) == {"workspace_id", "api_key", "job_agent_id", "token", "admin_user",
                          "admin_password"}
    assert set(second) == {"workspace_id", "api_key", "job_agent_id", "token"}
    assert (first["workspace_id"], first["job_agent_id"]) == \
        (second["workspace_id"], second["job_agent_id"])
    assert Workspace.objects.filter(name="demo").count() == 1
    assert JobAgent.objects.filter(name="demo-agent").count() == 1
    assert first["api_key"] != second["api_key"] and first["token"] != second["token"]
    for out in (first, second):  # both sets work: old credentials stay valid until revoked
        key = credentials.resolve_api_key(out["api_key"])
        assert str(key.workspace_id) == out["workspace_id"]
        token = credentials.resolve_agent_token(out["token"])
        assert str(token.job_agent_id) == out["job_agent_id"]


def test_bootstrap_demo_prints_an_operator_login_once_that_logs_into_the_admin(capsys, client):
    from django.contrib.auth import get_user_model

    call_command("bootstrap_demo")
    text = capsys.readouterr().out.splitlines()
    assert text[5:7] == ["Admin login (/admin/):", "  admin_user    demo-operator"]
    label, password, note = text[7].split(maxsplit=2)
    assert label == "password" and note == "(shown once)" and len(password) >= 20
    user = get_user_model().objects.get(username="demo-operator")
    assert user.is_superuser and user.is_staff and user.password != password  # hashed
    assert client.login(username="demo-operator", password=password)
    assert client.get("/admin/").status_code == 200
    # Run again: the same operator, the password not shown and not changed.
    call_command("bootstrap_demo", "--json")
    again = json.loads(capsys.readouterr().out)
    assert again["admin_user"] == "demo-operator" and again["admin_password"] is None
    assert get_user_model().objects.filter(username="demo-operator").count() == 1
    assert client.login(username="demo-operator", password=password)
