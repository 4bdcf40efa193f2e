from django.core.management.base import BaseCommand, CommandError

from agents import credentials
from agents.management.output import write_result
from jobqueue.models import Workspace


class Command(BaseCommand):
    help = "Create a workspace and print its id and, once, its API key."

    def add_arguments(self, parser):
        parser.add_argument("name", help="the workspace's name, e.g. acme-ci")
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args, **opts):
        name = opts["name"].strip()
        if not name:
            raise CommandError("NAME must not be empty")
        workspace = Workspace.objects.create(name=name)
        result = {
            "workspace_id": str(workspace.id),
            "api_key": credentials.issue_workspace_api_key(workspace),
        }
        write_result(self.stdout, result, opts["json"])
