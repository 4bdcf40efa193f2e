"""The reaper loop rides out a database outage and recovers on its own."""

import signal
import subprocess
import sys
import time

import pytest
from django.db import connection

from jobqueue import states
from jobqueue.db import NowPlusSeconds
from jobqueue.models import Job, JobClaim
from tests.factories import JobAgentFactory, claimed_job
from tests.netproxy import TcpProxy
from tests.utils import ROOT, subprocess_database_url, subprocess_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres_only]


def wait_for(predicate, timeout=60, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_reaper_loop_survives_database_outage():
    s = connection.settings_dict
    proxy = TcpProxy(s.get("HOST") or "127.0.0.1", int(s.get("PORT") or 5432)).start()
    url = subprocess_database_url().replace(f":{s.get('PORT') or 5432}/", f":{proxy.port}/")
    env = subprocess_env(DATABASE_URL=url, DATABASE_CONNECT_TIMEOUT="2")
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "reap_claims", "--loop", "--interval", "0.2"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    agent = JobAgentFactory(max_attempts=5)
    try:
        first, _ = claimed_job(job_agent=agent)
        JobClaim.objects.filter(job=first).update(claim_expires_at=NowPlusSeconds(-1))
        wait_for(lambda: Job.objects.get(id=first.id).status == states.QUEUED, what="reap 1")

        proxy.stop()  # the database "goes away" for the reaper
        second, _ = claimed_job(job_agent=agent)
        JobClaim.objects.filter(job=second).update(claim_expires_at=NowPlusSeconds(-1))
        time.sleep(2.5)  # several sweeps fail meanwhile
        assert Job.objects.get(id=second.id).status == states.IN_PROGRESS
        assert proc.poll() is None, "the reaper loop died during the outage"

        proxy = TcpProxy(proxy.target[0], proxy.target[1], listen_port=proxy.port).start()
        wait_for(lambda: Job.objects.get(id=second.id).status == states.QUEUED,
                 what="reap after the outage")
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        proxy.stop()
    assert proc.returncode == 0, err
    assert "reap failed, will retry" in err
