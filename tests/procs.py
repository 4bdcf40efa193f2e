"""Entry points that tests run as real, separate processes (each with its own connection).

    python -m tests.procs claim_drain AGENT_ID   # claim-next + report until empty; prints ids
    python -m tests.procs create_job AGENT_ID    # one job through lifecycle.create_job; its id
"""

import os
import sys


def _setup():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()


def claim_drain(agent_id: str) -> None:
    from jobqueue import lifecycle, states
    from jobqueue.models import JobAgent

    agent = JobAgent.objects.get(id=agent_id)
    while True:
        grant = lifecycle.claim_next_job(agent)
        if grant is None:
            break
        lifecycle.report_status(grant.job.id, grant.claim_id, states.SUCCESSFUL)
        sys.stdout.write(f"{grant.job.id}\n")
        sys.stdout.flush()


def create_job(agent_id: str) -> None:
    from jobqueue import lifecycle
    from jobqueue.models import JobAgent

    agent = JobAgent.objects.select_related("workspace").get(id=agent_id)
    job, _ = lifecycle.create_job(workspace=agent.workspace, job_agent=agent)
    sys.stdout.write(f"{job.id}\n")


if __name__ == "__main__":
    _setup()
    {"claim_drain": claim_drain, "create_job": create_job}[sys.argv[1]](*sys.argv[2:])
