"""Why isn't my job running? (`GET jobs/{job_id}/explain`; docs/api.md, "Why isn't my job
running? (explain)")

What the claim rule says of one job now, in words. It reads the rule (`claimrule.verdict`:
the conditions the job and the agents it is routed to meet, on the database's clock); it
never decides claimability a second time. Each condition of the rule that is not met becomes
a reason through REASONS (a condition's name to its builder): a condition added to the rule
gets its builder here (until then it is reported by its name and its doc). Beside the rule's
conditions, three facts a claim does not read but that keep the job from running: its group
was cancelled (the cancel under way ends it, and supersedes a claim taken meanwhile), no agent
of the workspace matches its labels, none of the agents it could go to is online (presence,
jobqueue/presence.py).

`claimable`: whether a claim by an agent the job is routed to would take it now (the job
meets the job conditions, an agent meets the agent conditions, the group is not cancelled).
With no agent to route to, it says what a matching agent's claim would do: `no_matching_agent`
and `no_matching_agent_online` stand beside `claimable: true`. Nothing here reads the app
server's clock, nor the job's dispatch_context.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from django.db.models import Count, Min, Subquery
from django.db.models.functions import Now

from jobqueue import claimrule, presence, states
from jobqueue.exceptions import NotFound
from jobqueue.keystats import rate_window
from jobqueue.lifecycle.dependencies import waiting_on
from jobqueue.models import Job, JobGroup, RateLimit

WAITING = frozenset({states.PENDING, states.QUEUED})
# Every code a reason may have, in the order reasons come (docs/api.md lists their meaning).
CODES = ("held", "waiting_on_dependencies", "in_progress", "finished", "not_before",
         "deadline_passed", "concurrency_limit", "rate_limited", "agent_paused",
         "group_cancelled", "no_matching_agent", "no_matching_agent_online")


@dataclass(frozen=True)
class Explanation:
    status: str
    claimable: bool
    reasons: list[dict]
    agents: dict = field(default_factory=dict)  # {"matching": n, "online": n}


def _reason(code: str, detail: str, **extra) -> dict:
    return {"code": code, "detail": detail, **extra}


# --- one builder per condition of the rule: (verdict) -> a reason, or None -----------------


def _not_queued(found: claimrule.Verdict) -> dict:
    job = found.job
    if job.status == states.PENDING and job.has_parents:
        parents = waiting_on(job)
        return _reason("waiting_on_dependencies",
                       f"The job waits (pending) for its dependencies: {len(parents)} not yet "
                       "successful. It is queued once they all are, and ends cancelled if one "
                       "ends otherwise.", waiting_on=parents)
    if job.status == states.PENDING:
        return _reason("held", "The job is pending (created with hold): `POST "
                       "jobs/{job_id}/dispatch` queues it.")
    if job.status == states.IN_PROGRESS:
        return _reason("in_progress", f"An agent holds the job (attempt {job.attempt}): it is "
                       "not waiting.", job_agent_id=job.job_agent_id, attempt=job.attempt)
    return _reason("finished", f"The job ended {job.status}: it is not waiting (`POST "
                   "jobs/{job_id}/requeue` runs it again).")


def _not_available(found: claimrule.Verdict) -> dict | None:
    job = found.job
    if job.status == states.PENDING and not job.has_parents:
        return None  # a dispatch queues it available now
    return _reason("not_before", "Not claimable before its available_at (a delay, a debounce, "
                   "a retry's backoff or a release's retry_after).",
                   available_at=job.available_at)


def _expired(found: claimrule.Verdict) -> dict:
    return _reason("deadline_passed", "Its expires_at has passed: the reaper ends it expired.",
                   expires_at=found.job.expires_at)


def _concurrency_limit(found: claimrule.Verdict) -> dict:
    """Held back by its concurrency key: `running`, the workspace's jobs with the key in
    progress now (one count, read only for a job that is held back)."""
    job = found.job
    running = Job.objects.filter(workspace_id=job.workspace_id, status=states.IN_PROGRESS,
                                 concurrency_key=job.concurrency_key).count()
    taken = (f"{running} of them are in progress" if running >= (job.concurrency_limit or 0)
             else f"{running} of them are in progress and queued jobs of the key that were "
             "given a slot before it hold the others (or it is not due, or its agent is "
             "paused: a slot goes only to a job a claim could take now)")
    return _reason("concurrency_limit", f"Its concurrency key holds it back: at most "
                   f"{job.concurrency_limit} of the workspace's jobs with the key run at once, "
                   f"and {taken}. A slot frees when one of them leaves in_progress; the key's "
                   "jobs take the slots in claim order.",
                   key=job.concurrency_key, running=running, limit=job.concurrency_limit)


def _rate_limited(found: claimrule.Verdict) -> dict:
    """Held back by its rate limit: the key's `count` and `period_seconds`, `claimed` (the
    workspace's jobs with the key claimed in the window: their latest claim, started_at, in
    the last period_seconds) and `until`, when the window next lets a claim through (the
    oldest claim in it leaves; a period from now when none is in it: queued jobs given a
    permit hold the key's permits, and none of their claims can leave the window sooner).
    One query, on the database's clock, read only for a job that is held back. A key without
    a limit limits nothing: its held jobs are given a permit as soon as the key is settled
    (count, period_seconds, claimed and until are null). The window is jobqueue.keystats'
    (/metrics and the admin read the same)."""
    job = found.job
    key = job.rate_limit_key
    window = rate_window().values("rate_limit_key")
    limit = (RateLimit.objects.filter(workspace_id=job.workspace_id, key=key)
             .annotate(claimed=Subquery(window.annotate(n=Count("id")).values("n")),
                       oldest=Subquery(window.annotate(m=Min("started_at")).values("m")),
                       now=Now())
             .first())
    if limit is None:
        return _reason("rate_limited", "Its rate limit key has no limit (none set, or just "
                       "removed): the key limits nothing, and the job is given a permit as soon "
                       "as the key is settled (at once, or at the next maintenance sweep).",
                       key=key, count=None, period_seconds=None, claimed=None, until=None)
    claimed = limit.claimed or 0
    period = limit.period_seconds
    until = (limit.oldest or limit.now) + timedelta(seconds=period)
    taken = (f"{claimed} of them were claimed in the last {period} s" if claimed >= limit.count
             else f"{claimed} of them were claimed in the last {period} s and queued jobs of "
             "the key that were given a permit before it hold the others (or it is not due, "
             "its agent is paused or it waits for its concurrency slot: a permit goes only to "
             "a job a claim could take now)")
    return _reason("rate_limited", f"Its rate limit holds it back: at most {limit.count} of "
                   f"the workspace's jobs with the key are claimed in any {period} s, and "
                   f"{taken}. The window next lets a claim through at {until.isoformat()}; the "
                   "key's jobs take the permits in claim order.",
                   key=key, count=limit.count, period_seconds=period, claimed=claimed,
                   until=until)


def _agent_paused(found: claimrule.Verdict) -> dict | None:
    if not found.agents:
        return None  # no agent to pause: no_matching_agent says so
    if found.job.label_set_id is None:
        return _reason("agent_paused", "Its job agent is paused: its claims hand out nothing "
                       "until it is resumed.")
    return _reason("agent_paused", f"Every job agent that matches its labels "
                   f"({len(found.agents)}) is paused: their claims hand out nothing until one "
                   "is resumed.")


REASONS: dict[str, Callable[[claimrule.Verdict], dict | None]] = {
    "queued": _not_queued,
    "available": _not_available,
    "not_expired": _expired,
    "concurrency_slot": _concurrency_limit,
    "rate_permit": _rate_limited,
    "agent_not_paused": _agent_paused,
}


def _unnamed(name: str) -> Callable[[claimrule.Verdict], dict]:
    """A condition of the rule without a builder yet: its name and its doc."""
    doc = next(c.doc for c in claimrule.JOB_CONDITIONS + claimrule.AGENT_CONDITIONS
               if c.name == name)
    return lambda found: _reason(name, f"Not met: {doc}.")


# --- what a claim does not read ----------------------------------------------------------


def _group_cancelled(job) -> dict | None:
    if job.group is None or not JobGroup.objects.filter(
            workspace_id=job.workspace_id, name=job.group, cancelled_at__isnull=False).exists():
        return None
    return _reason("group_cancelled", "Its group was cancelled: the cancel ends its live jobs "
                   "(a claim taken meanwhile is superseded).", group=job.group)


def _routing(found: claimrule.Verdict, online: int) -> dict | None:
    job = found.job
    if not found.agents:
        return _reason("no_matching_agent", "No job agent of the workspace has all of its "
                       "labels: nothing claims it until one has (POST job-agents, PATCH "
                       "job-agents/{agent_id}, or a registration).", labels=job.labels)
    if not online:
        return _reason("no_matching_agent_online", "None of the job agents that may claim it "
                       f"({len(found.agents)}) has been seen within the last "
                       f"{presence.online_seconds():g} s (JOBQUEUE_AGENT_ONLINE_SECONDS): "
                       "it waits for one to ask for work.")
    return None


def explain_job(job_id, *, workspace_id) -> Explanation:
    """Why the job of `workspace_id` is not running, or that the next claim takes it.
    NotFound for a job not in the workspace."""
    found = claimrule.verdict(job_id, workspace_id=workspace_id,
                              annotate_agents={"online": presence.online()})
    if found is None:
        raise NotFound("No such job.")
    job = found.job
    waiting = job.status in WAITING
    names = found.unmet if waiting else ["queued"]
    reasons = [(REASONS.get(name) or _unnamed(name))(found) for name in names]
    group = _group_cancelled(job)
    online = sum(1 for agent in found.agents if agent.online)
    reasons += [group, _routing(found, online) if waiting else None]
    claimable = (not found.job_unmet and (not found.agents or not found.agent_unmet)
                 and group is None)
    return Explanation(status=job.status, claimable=claimable,
                       reasons=[r for r in reasons if r is not None],
                       agents={"matching": len(found.agents), "online": online})
