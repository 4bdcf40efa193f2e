"""Acceptance scenario 7: a bounded chaos run.

Hundreds of small jobs, several agents (single and batch paths) and two reapers, while agents
and reapers are SIGKILLed and SIGSTOPped at random. At the end every job is terminal exactly
once, and the event log shows that no write carrying a stale claim_id was accepted. The number
of duplicated executions (the price of at-least-once) is printed. Set E2E_CHAOS_SEED to replay
a run's choices; E2E_CHAOS_SECONDS bounds the chaos phase (default 35)."""

import os
import random
import signal
import time

import pytest

from jobqueue import states
from jobqueue.models import Job, JobClaim, JobEvent

from .harness import audit, duplicated_executions, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]

JOBS = 320
CONCURRENCY = [1, 2, 3, 2]


def test_chaos_every_job_ends_exactly_once_and_stale_writes_are_refused(
        stack, make_agent, make_jobs, say):
    seed = int(os.environ.get("E2E_CHAOS_SEED") or time.time_ns() % 1_000_000)
    chaos_seconds = float(os.environ.get("E2E_CHAOS_SECONDS") or 35)
    rng = random.Random(seed)
    say(f"chaos seed {seed} (E2E_CHAOS_SEED={seed} replays the choices)")

    agent, token = make_agent(lease_seconds=2, max_attempts=25)
    jobs = []
    for pause in ("0.05", "0.1", "0.3", "0.8"):
        jobs += make_jobs(agent, JOBS // 4, stack.command(f"sleep {pause}"))
    ids = [j.id for j in jobs]

    serial = iter(range(1000))
    agents = [stack.start_agent(agent, token, f"ag{next(serial)}", concurrency=n)
              for n in CONCURRENCY]
    reapers = [stack.start_reaper(interval=0.5), stack.start_reaper(interval=0.5)]
    frozen = {}  # proc -> monotonic time to SIGCONT it
    actions = {"kill_agent": 0, "stop_agent": 0, "kill_reaper": 0, "stop_reaper": 0}

    def finished():
        return Job.objects.filter(id__in=ids, status__in=states.TERMINAL).count()

    def thaw(due_only=True):
        now = time.monotonic()
        for proc, at in list(frozen.items()):
            if not due_only or at <= now:
                proc.signal(signal.SIGCONT)
                del frozen[proc]

    end = time.monotonic() + chaos_seconds
    while time.monotonic() < end and finished() < len(ids):
        time.sleep(rng.uniform(0.2, 0.6))
        thaw()
        action = rng.choice(["kill_agent", "kill_agent", "stop_agent", "stop_agent",
                             "kill_reaper", "stop_reaper"])
        pool = agents if action.endswith("agent") else reapers
        candidates = [p for p in pool if p not in frozen]
        if not candidates:
            continue
        victim = rng.choice(candidates)
        actions[action] += 1
        if action.startswith("kill"):
            victim.signal(signal.SIGKILL)
            victim.popen.wait()
            pool.remove(victim)
            if pool is agents:
                n = CONCURRENCY[len(agents) % len(CONCURRENCY)]
                # Not waited for: the chaos may strike an agent while it starts, too.
                agents.append(stack.start_agent(agent, token, f"ag{next(serial)}",
                                                concurrency=n, wait_ready=False))
            else:
                reapers.append(stack.start_reaper(interval=0.5, wait_ready=False))
        else:
            victim.signal(signal.SIGSTOP)
            frozen[victim] = time.monotonic() + rng.uniform(0.5, 4.0)
    chaos_took = chaos_seconds - max(0.0, end - time.monotonic())
    thaw(due_only=False)

    wait_for(lambda: finished() == len(ids), 120, "every job to end after the chaos",
             interval=0.5, on_fail=stack.logs)
    report = audit(ids)
    refused = JobEvent.objects.filter(job_id__in=ids, kind=JobEvent.STALE_WRITE_REFUSED)
    dups = duplicated_executions(stack, ids)
    say(f"chaos: {chaos_took:.0f}s, actions {actions}; {len(ids)} jobs -> "
          f"{dict(report['statuses'])}; {len(stack.starts())} executions, "
          f"{dups} duplicated executions; {refused.count()} stale writes refused; "
          f"events {dict(report['kinds'])}")

    assert report["violations"] == []  # no write with a stale claim_id was accepted
    assert report["terminal_not_once"] == {}  # every job terminal exactly once
    assert set(report["statuses"]) <= {states.SUCCESSFUL, states.EXPIRED}
    assert sum(actions.values()) > 0
    for job in Job.objects.filter(id__in=ids, status=states.SUCCESSFUL):
        # The accepted result was produced by the attempt that held the current claim.
        assert job.result["attempt"] == job.attempt
    assert not JobClaim.objects.filter(job_id__in=ids).exists()
    assert [a.stop() for a in agents] == [0] * len(agents)
    assert [r.stop() for r in reapers] == [0] * len(reapers)
