import json

from django.core.management.base import BaseCommand, CommandError

from jobqueue.models import Workspace


class Command(BaseCommand):
    help = "Create a workspace and print its id (and, once, its API key when credentials exist)."

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args, **opts):
        name = opts["name"].strip()
        if not name:
            raise CommandError("NAME must not be empty")
        workspace = Workspace.objects.create(name=name)
        out = {"workspace_id": str(workspace.id)}
        issue_key = _credential_issuer("issue_workspace_api_key")
        if issue_key:
            out["api_key"] = issue_key(workspace)
        if opts["json"]:
            self.stdout.write(json.dumps(out))
        else:
            for key, value in out.items():
                self.stdout.write(f"{key}: {value}")


def _credential_issuer(name):
    """The HTTP edge (agents app) owns credentials; the core works without it."""
    try:
        from agents import credentials
    except ImportError:
        return None
    return getattr(credentials, name, None)
