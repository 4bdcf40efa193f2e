import json
import os
import secrets
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction
from django.db.models.functions import Now

from agents import credentials
from agents.models import AgentToken, WorkspaceApiKey
from jobqueue import lifecycle
from jobqueue.models import JobAgent, Workspace


class Command(BaseCommand):
    help = (
        "Make sure a 'demo' workspace with a 'demo-agent' exists and print a workspace API key "
        "and an agent token for them: the same ones as the last run while they are valid (kept "
        "in var/demo-credentials.json, 0600), else new ones, and then the ones an earlier run "
        "issued are revoked (only those: credentials named 'bootstrap'). And an admin login "
        "for the demo's operator, whose random password is shown once, when created."
    )

    OPERATOR = "demo-operator"
    # The name of the credentials this command issues: the only ones it ever revokes.
    NAME = "bootstrap"

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="print one JSON object")
        parser.add_argument("--rotate", action="store_true",
                            help="issue a new key and token even when the last ones are valid "
                                 "(and revoke those)")
        parser.add_argument("--credentials-file", type=Path, default=None,
                            help="where the demo's key and token are kept between runs "
                                 "(default: var/demo-credentials.json)")

    def handle(self, *args, **opts):
        workspace = Workspace.objects.filter(name="demo").order_by("created_at").first()
        if workspace is None:
            workspace = Workspace.objects.create(name="demo")
        agent = JobAgent.objects.filter(workspace=workspace, name="demo-agent").first()
        if agent is None:
            agent = lifecycle.create_job_agent(workspace=workspace, name="demo-agent")
        path = opts["credentials_file"] or Path(settings.VAR_DIR) / "demo-credentials.json"
        kept = None if opts["rotate"] else self._kept(path, workspace, agent)
        if kept is not None:
            out = {"workspace_id": str(workspace.id), "job_agent_id": str(agent.id), **kept}
            revoked = 0
        else:
            out = self._issue(workspace, agent)
            revoked = out.pop("revoked")
            self._keep(path, out)
        password = self._operator()
        if opts["json"]:
            self.stdout.write(json.dumps({**out, "reused": kept is not None,
                                          "revoked_previous": revoked,
                                          "admin_user": self.OPERATOR,
                                          "admin_password": password}))
            return
        if kept is not None:
            self.stdout.write("Demo credentials (the same as the last run; new ones: "
                              "bootstrap_demo --rotate):")
        else:
            self.stdout.write("Demo credentials (kept for the next run; issue more with "
                              "create_job_agent):")
        for key in ("workspace_id", "api_key", "job_agent_id", "token"):
            self.stdout.write(f"  {key:13} {out[key]}")
        if revoked:
            self.stdout.write("  (the demo key and token an earlier run printed are revoked)")
        self.stdout.write("Admin login (/admin/):")
        self.stdout.write(f"  {'admin_user':13} {self.OPERATOR}")
        if password is None:
            self.stdout.write(
                f"  {'password':13} (shown once, when it was created; "
                f"reset: manage.py changepassword {self.OPERATOR})"
            )
        else:
            self.stdout.write(f"  {'password':13} {password}  (shown once)")

    def _kept(self, path: Path, workspace, agent) -> dict | None:
        """The key and token of the last run, when the file holds them and both are still
        valid credentials of this workspace and agent."""
        try:
            kept = json.loads(path.read_text())
            key = credentials.resolve_api_key(str(kept["api_key"]))
            token = credentials.resolve_agent_token(str(kept["token"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if key is None or token is None or key.workspace_id != workspace.id \
                or token.job_agent_id != agent.id:
            return None
        return {"api_key": kept["api_key"], "token": kept["token"]}

    def _issue(self, workspace, agent) -> dict:
        """A new key and token; those an earlier run issued are revoked (secrets are stored
        hashed: an old one can be reused only from the file)."""
        with transaction.atomic():
            revoked = (
                WorkspaceApiKey.objects.active()
                .filter(workspace=workspace, name=self.NAME).update(revoked_at=Now())
                + AgentToken.objects.active()
                .filter(job_agent=agent, name=self.NAME).update(revoked_at=Now())
            )
            return {
                "workspace_id": str(workspace.id),
                "api_key": credentials.issue_workspace_api_key(workspace, name=self.NAME),
                "job_agent_id": str(agent.id),
                "token": credentials.issue_agent_token(agent, name=self.NAME),
                "revoked": revoked,
            }

    @staticmethod
    def _keep(path: Path, out: dict) -> None:
        """Write the file 0600 from its first byte (a temporary file, then a rename)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"api_key": out["api_key"], "token": out["token"]}, f)
        os.replace(tmp, path)

    def _operator(self) -> str | None:
        """Create the demo's operator (a superuser) once, with a random password: the
        password when created now, else None (it is stored hashed, never shown again)."""
        users = get_user_model().objects
        if users.filter(username=self.OPERATOR).exists():
            return None
        password = secrets.token_urlsafe(15)
        users.create_superuser(self.OPERATOR, email="", password=password)
        return password
