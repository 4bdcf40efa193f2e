from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from agents import credentials
from agents.management.output import write_result
from jobqueue import lifecycle
from jobqueue.exceptions import InvalidInput
from jobqueue.models import Workspace


class Command(BaseCommand):
    help = "Create a job agent in a workspace and print its id (and, once, its token)."

    def add_arguments(self, parser):
        parser.add_argument("name", help="the agent's name, unique in its workspace")
        parser.add_argument("--workspace", required=True, help="workspace id")
        parser.add_argument(
            "--lease-seconds", type=int, default=None,
            help="lease of each claim when the agent asks for none (default "
                 "JOBQUEUE_DEFAULT_LEASE_SECONDS, 60; between JOBQUEUE_MIN_LEASE_SECONDS and "
                 "JOBQUEUE_MAX_LEASE_SECONDS): how long a dead agent's job waits to run again")
        parser.add_argument(
            "--max-attempts", type=int, default=None,
            help="claims a job of this agent may use, when its producer says nothing (default "
                 "JOBQUEUE_DEFAULT_MAX_ATTEMPTS, 3; at most JOBQUEUE_MAX_MAX_ATTEMPTS, 100)")
        parser.add_argument(
            "--max-runtime-seconds", type=int, default=None,
            help="longest one attempt of its jobs may run, heartbeats or not, when the "
                 "producer says nothing (default: no limit; docs/clocks.md)")
        parser.add_argument(
            "--label", action="append", default=[], dest="labels", metavar="LABEL",
            help="a label of the agent (repeat for several; up to 32, each 1 to 63 characters "
                 "of A-Z a-z 0-9 . _ : = / -)")
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args, **opts):
        try:
            workspace = Workspace.objects.get(id=opts["workspace"])
        except (Workspace.DoesNotExist, ValidationError) as exc:
            raise CommandError(f"no workspace with id {opts['workspace']!r}") from exc
        try:
            agent = lifecycle.create_job_agent(
                workspace=workspace,
                name=opts["name"],
                lease_seconds=opts["lease_seconds"],
                max_attempts=opts["max_attempts"],
                max_runtime_seconds=opts["max_runtime_seconds"],
                labels=opts["labels"],
            )
        except InvalidInput as exc:
            raise CommandError(exc.detail) from exc
        result = {
            "job_agent_id": str(agent.id),
            "workspace_id": str(workspace.id),
            "token": credentials.issue_agent_token(agent),
        }
        write_result(self.stdout, result, opts["json"])
