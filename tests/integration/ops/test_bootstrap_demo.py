"""`manage.py bootstrap_demo` (what `make run` prints): one demo workspace and agent, however
often it runs; the same key and token every run while they stay valid (kept in a 0600 file),
new ones when they do not or on --rotate, and then the earlier run's are revoked (only those),
so that `make run` never leaves a trail of valid demo credentials."""

import json
import stat

import pytest
from django.core.management import call_command

from agents import credentials
from agents.models import AgentToken, WorkspaceApiKey
from jobqueue.models import JobAgent, Workspace

pytestmark = pytest.mark.django_db


@pytest.fixture
def kept(tmp_path):
    return tmp_path / "var" / "demo-credentials.json"


def bootstrap(capsys, kept, *args) -> dict:
    call_command("bootstrap_demo", "--json", "--credentials-file", str(kept), *args)
    return json.loads(capsys.readouterr().out)


def works(out) -> bool:
    key = credentials.resolve_api_key(out["api_key"])
    token = credentials.resolve_agent_token(out["token"])
    return bool(key and token and str(key.workspace_id) == out["workspace_id"]
                and str(token.job_agent_id) == out["job_agent_id"])


def test_every_run_prints_the_same_working_credentials(capsys, kept):
    first = bootstrap(capsys, kept)
    assert set(first) == {"workspace_id", "api_key", "job_agent_id", "token", "admin_user",
                          "admin_password", "reused", "revoked_previous"}
    assert first["reused"] is False and works(first)
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    call_command("bootstrap_demo", "--credentials-file", str(kept))
    text = capsys.readouterr().out.splitlines()
    assert text[0] == ("Demo credentials (the same as the last run; new ones: "
                       "bootstrap_demo --rotate):")
    second = dict(line.split() for line in text[1:5])
    assert text[5:7] == ["Admin login (/admin/):", "  admin_user    demo-operator"]
    assert text[7].startswith("  password      (shown once, when it was created; reset:")
    assert second == {k: first[k] for k in ("workspace_id", "api_key", "job_agent_id", "token")}
    assert Workspace.objects.filter(name="demo").count() == 1
    assert JobAgent.objects.filter(name="demo-agent").count() == 1
    assert AgentToken.objects.count() == 1 and WorkspaceApiKey.objects.count() == 1


def test_rotate_or_a_lost_or_revoked_pair_issues_new_ones_and_revokes_the_old(capsys, kept):
    first = bootstrap(capsys, kept)
    rotated = bootstrap(capsys, kept, "--rotate")
    assert rotated["reused"] is False and rotated["revoked_previous"] == 2
    assert works(rotated) and not works(first)
    assert first["api_key"] != rotated["api_key"] and first["token"] != rotated["token"]
    # The file is gone (another checkout, a fresh var/): new ones, the old revoked.
    kept.unlink()
    fresh = bootstrap(capsys, kept)
    assert fresh["revoked_previous"] == 2 and works(fresh) and not works(rotated)
    # Someone revoked the token in the admin: new ones.
    credentials.revoke_agent_token(credentials.resolve_agent_token(fresh["token"]))
    again = bootstrap(capsys, kept)
    assert again["reused"] is False and works(again)
    # A damaged file: new ones.
    kept.write_text("{not json")
    assert bootstrap(capsys, kept)["reused"] is False


def test_bootstrap_demo_revokes_only_what_it_issued(capsys, kept):
    first = bootstrap(capsys, kept)
    workspace = Workspace.objects.get(id=first["workspace_id"])
    agent = JobAgent.objects.get(id=first["job_agent_id"])
    # An operator's own credentials for the demo (other names) stay valid.
    own_key = credentials.issue_workspace_api_key(workspace, name="ci")
    own_token = credentials.issue_agent_token(agent, name="laptop")
    for _ in range(3):
        last = bootstrap(capsys, kept, "--rotate")
        assert last["revoked_previous"] == 2
    assert credentials.resolve_api_key(own_key) and credentials.resolve_agent_token(own_token)
    assert works(last)
    assert AgentToken.objects.active().filter(job_agent=agent, name="bootstrap").count() == 1
    assert WorkspaceApiKey.objects.active().filter(workspace=workspace,
                                                   name="bootstrap").count() == 1


def test_bootstrap_demo_prints_an_operator_login_once_that_logs_into_the_admin(capsys, client,
                                                                              kept):
    from django.contrib.auth import get_user_model

    call_command("bootstrap_demo", "--credentials-file", str(kept))
    text = capsys.readouterr().out.splitlines()
    assert text[0].startswith("Demo credentials (kept for the next run;")
    assert text[5:7] == ["Admin login (/admin/):", "  admin_user    demo-operator"]
    label, password, note = text[7].split(maxsplit=2)
    assert label == "password" and note == "(shown once)" and len(password) >= 20
    user = get_user_model().objects.get(username="demo-operator")
    assert user.is_superuser and user.is_staff and user.password != password  # hashed
    assert client.login(username="demo-operator", password=password)
    assert client.get("/admin/").status_code == 200
    # Run again: the same operator, the password not shown and not changed.
    again = bootstrap(capsys, kept)
    assert again["admin_user"] == "demo-operator" and again["admin_password"] is None
    assert get_user_model().objects.filter(username="demo-operator").count() == 1
    assert client.login(username="demo-operator", password=password)


def test_the_text_output_says_when_the_earlier_pair_was_revoked(capsys, kept):
    first = bootstrap(capsys, kept)
    call_command("bootstrap_demo", "--credentials-file", str(kept), "--rotate")
    text = capsys.readouterr().out.splitlines()
    assert text[0].startswith("Demo credentials (kept for the next run;")
    assert "  (the demo key and token an earlier run printed are revoked)" in text
    assert not works(first)
