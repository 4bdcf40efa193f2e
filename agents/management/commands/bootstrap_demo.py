import json
import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from agents import credentials
from jobqueue import lifecycle
from jobqueue.models import JobAgent, Workspace


class Command(BaseCommand):
    help = (
        "Make sure a 'demo' workspace with a 'demo-agent' exists, and print a fresh workspace "
        "API key and agent token for them (old ones stay valid until revoked); and an admin "
        "login for the demo's operator, whose random password is shown once, when created."
    )

    OPERATOR = "demo-operator"

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true")

    def handle(self, *args, **opts):
        workspace = Workspace.objects.filter(name="demo").order_by("created_at").first()
        if workspace is None:
            workspace = Workspace.objects.create(name="demo")
        agent = JobAgent.objects.filter(workspace=workspace, name="demo-agent").first()
        if agent is None:
            agent = lifecycle.create_job_agent(workspace=workspace, name="demo-agent")
        out = {
            "workspace_id": str(workspace.id),
            "api_key": credentials.issue_workspace_api_key(workspace, name="bootstrap"),
            "job_agent_id": str(agent.id),
            "token": credentials.issue_agent_token(agent, name="bootstrap"),
        }
        password = self._operator()
        if opts["json"]:
            self.stdout.write(json.dumps({**out, "admin_user": self.OPERATOR,
                                          "admin_password": password}))
            return
        self.stdout.write("Demo credentials (shown once; issue more with create_job_agent):")
        for key, value in out.items():
            self.stdout.write(f"  {key:13} {value}")
        self.stdout.write("Admin login (/admin/):")
        self.stdout.write(f"  {'admin_user':13} {self.OPERATOR}")
        if password is None:
            self.stdout.write(
                f"  {'password':13} (shown once, when it was created; "
                f"reset: manage.py changepassword {self.OPERATOR})"
            )
        else:
            self.stdout.write(f"  {'password':13} {password}  (shown once)")

    def _operator(self) -> str | None:
        """Create the demo's operator (a superuser) once, with a random password: the
        password when created now, else None (it is stored hashed, never shown again)."""
        users = get_user_model().objects
        if users.filter(username=self.OPERATOR).exists():
            return None
        password = secrets.token_urlsafe(15)
        users.create_superuser(self.OPERATOR, email="", password=password)
        return password
