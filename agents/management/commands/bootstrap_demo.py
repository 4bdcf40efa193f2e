import json

from django.core.management.base import BaseCommand

from agents import credentials
from jobqueue import lifecycle
from jobqueue.models import JobAgent, Workspace


class Command(BaseCommand):
    help = (
        "Make sure a 'demo' workspace with a 'demo-agent' exists, and print a fresh workspace "
        "API key and agent token for them (old ones stay valid until revoked)."
    )

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
        if opts["json"]:
            self.stdout.write(json.dumps(out))
            return
        self.stdout.write("Demo credentials (shown once; issue more with create_job_agent):")
        for key, value in out.items():
            self.stdout.write(f"  {key:13} {value}")
