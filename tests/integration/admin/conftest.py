"""Admin test fixtures: an operator (superuser), view-only staff, and jobs in each situation
the Recovery page knows about, reached through the real lifecycle functions."""

import pytest
from django.contrib.auth.models import Permission

from jobqueue import lifecycle, states
from jobqueue.db import NowPlusSeconds
from jobqueue.maintenance import reaper
from jobqueue.models import JobClaim
from tests.factories import JobAgentFactory, JobFactory, claimed_job

SECRET = "hunter2-dispatch-secret-4f1c9a"


@pytest.fixture
def operator(django_user_model):
    return django_user_model.objects.create_superuser("olga", "olga@example.com", None)


@pytest.fixture
def viewer(django_user_model):
    """Staff with every view permission of our apps and no other (no password: the
    tests log in with force_login, which skips the slow password hash)."""
    user = django_user_model.objects.create_user("vera", "vera@example.com", None)
    user.is_staff = True
    user.save()
    user.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label__in=["jobqueue", "agents", "admin"],
            codename__startswith="view_",
        )
    )
    return user


@pytest.fixture
def op_client(client, operator):
    client.force_login(operator)
    return client


@pytest.fixture
def viewer_client(client, viewer):
    client.force_login(viewer)
    return client


def expire_lease(job, seconds_ago=30):
    """Test setup: make the claim's lease run out `seconds_ago`, as if the agent had died."""
    JobClaim.objects.filter(job_id=job.id).update(claim_expires_at=NowPlusSeconds(-seconds_ago))


@pytest.fixture
def agent():
    return JobAgentFactory(lease_seconds=60, max_attempts=3)


@pytest.fixture
def jobs(agent):
    """One job in each situation, all of one agent (except `other`)."""
    queued = JobFactory(job_agent=agent, dispatch_context={"api_password": SECRET})
    healthy, _ = claimed_job(job_agent=agent, dispatch_context={"api_password": SECRET},
                             idempotency_key="idem-healthy", external_id="ext-healthy")
    # Ended expired: its lease ran out on its last attempt and the reaper ended it.
    dead, _ = claimed_job(job_agent=agent, max_attempts=1, initial_max_attempts=1,
                          dispatch_context={"api_password": SECRET})
    expire_lease(dead)
    assert reaper.sweep().expired == 1
    # Stuck: its agent died and the reaper has not run since.
    stuck, _ = claimed_job(job_agent=agent, dispatch_context={"api_password": SECRET})
    expire_lease(stuck)
    done, grant = claimed_job(job_agent=agent, dispatch_context={"api_password": SECRET})
    lifecycle.report_status(done.id, grant.claim_id, states.SUCCESSFUL, result={"ok": True})
    other = JobFactory(dispatch_context={"api_password": SECRET})
    return {
        "queued": queued,
        "healthy": healthy,
        "stuck": stuck,
        "dead": dead,
        "done": done,
        "other": other,
    }
