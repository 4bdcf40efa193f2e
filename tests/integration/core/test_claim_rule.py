"""The claim rule (jobqueue/claimrule.py) is the one definition of which job a claim may take
and in which order: the ORM claim and the wake-up re-check derive from it, and the PostgreSQL
statements, written whole in jobqueue/sql/postgresql.sql, are held to it here clause by
clause, so a condition added to the rule fails until they say it too."""

import datetime as dt
import re
import uuid

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from jobqueue import claimrule, lifecycle
from jobqueue.db import NowPlusSeconds
from jobqueue.models import Job, JobAgent
from tests.factories import JobAgentFactory, JobFactory

pytestmark = pytest.mark.django_db


def _clauses(sql: str, params) -> dict:
    """A locking SELECT's WHERE (as a set of conditions), ORDER BY, LIMIT and lock, with
    Django's quoting, qualifiers and positional parameters written as the statement's."""
    for value in params:
        sql = sql.replace("%s", "%(agent)s" if isinstance(value, uuid.UUID) else f"'{value}'", 1)
    sql = " ".join(re.sub(r'"(job|job_agent)"\.', "", sql).replace('"', "").split())
    sql = re.sub(r"LIMIT \d+", "LIMIT %(limit)s", sql).replace(" ASC", "")
    sql = re.sub(r" OF (job|job_agent)\b", "", sql)
    sql = sql.replace("(STATEMENT_TIMESTAMP())", "STATEMENT_TIMESTAMP()")
    m = re.search(r"WHERE (.*?)(?: ORDER BY (.*?))?(?: (LIMIT \S+))?(?: (FOR .*))?$", sql)
    assert m, sql
    where = m[1][1:-1] if m[1].startswith("(") and m[1].endswith(")") else m[1]
    return {"where": set(where.split(" AND ")), "order": _terms(m[2] or ""),
            "lock": m[4], "limited": bool(m[3])}


def _terms(order: str) -> list[str]:
    """An ORDER BY's terms (a comma inside a function's parentheses is not a separator)."""
    return re.split(r", (?![^(]*\))", order)


# The routing condition of job_claim_by_id (claimrule.routed_to for any agent: its own jobs,
# or a labelled job of a set its labels include), compared as one clause.
ROUTED_BY_ID = ("((job_agent_id = %(agent)s AND label_set_id IS NULL) "
                "OR EXISTS (SELECT 1 FROM job_agent a JOIN job_label_set s "
                "ON s.workspace_id = a.workspace_id WHERE a.id = %(agent)s "
                "AND s.id = job.label_set_id AND a.labels @> s.labels))")
OWN = {"job_agent_id = %(agent)s", "label_set_id IS NULL"}


def _locking(statement: str, start="WITH locked AS MATERIALIZED (", end="), gate") -> dict:
    """The locking SELECT of a claim statement (its `locked` CTE, or the part of it between
    `start` and `end`)."""
    body = statement.split(start, 1)[1].split(end, 1)[0]
    body = " ".join(body.split()).replace(ROUTED_BY_ID, "ROUTED")
    return _clauses("SELECT id FROM job " + body.split("FROM job", 1)[1], ())


def _gate(statement: str) -> dict:
    """The agent's gate of a claim statement, less its `a job was locked` condition."""
    body = statement.split("gate AS MATERIALIZED (", 1)[1].split("), claimed", 1)[0]
    clauses = _clauses(body.strip(), ())
    clauses["where"].discard("EXISTS (SELECT 1 FROM locked)")
    return clauses


def _orm():
    """What the ORM compiles from the rule: the next jobs, one named job (at an attempt), and
    the agent's gate."""
    agent = JobAgentFactory.build(id=uuid.uuid4())
    job_id = uuid.uuid4()
    with transaction.atomic():  # FOR UPDATE compiles only inside a transaction
        nxt = lifecycle.claim_candidates(agent).values("id")[:5].query.sql_with_params()
        one = lifecycle.claim_candidates(agent, Job.objects.filter(id=job_id, attempt=7))
        one = one.values("id").query.sql_with_params()
        gate = (JobAgent.objects.filter(claimrule.agent_may_claim(), id=agent.id)
                .select_for_update().values("id").query.sql_with_params())
    text = one[0]
    for value in one[1]:  # the statement's names for the ORM's positional parameters
        name = ("%(job)s" if value == job_id else "%(expected)s" if value == 7
                else "%(agent)s" if isinstance(value, uuid.UUID) else f"'{value}'")
        text = text.replace("%s", name, 1)
    named = _clauses(text, ())
    named["where"] = {"(%(expected)s::integer IS NULL OR attempt = %(expected)s::integer)"
                      if c == "attempt = %(expected)s" else c for c in named["where"]}
    agent_gate = _clauses(*gate)
    agent_gate["where"] = {c.replace("id = ", "job_agent.id = ").replace(
        "paused_at", "job_agent.paused_at") for c in agent_gate["where"]}
    return _clauses(*nxt), named, agent_gate


def rule_mismatches() -> list[str]:
    """Where the PostgreSQL claim statements and the rule, as the ORM compiles it, differ."""
    from jobqueue.sql import postgresql

    expected, named, gate = _orm()
    found = []
    if _locking(postgresql.job_claim_available) != expected:
        found.append(f"job_claim_available locks {_locking(postgresql.job_claim_available)}, "
                     f"the rule {expected}")
    by_id = _locking(postgresql.job_claim_by_id)
    named_routed = (named["where"] - OWN) | {"ROUTED"}
    if (by_id["where"], by_id["lock"]) != (named_routed, named["lock"]):
        found.append(f"job_claim_by_id locks {by_id}, the rule {named}")
    routed = postgresql.job_claim_available_routed
    own = _locking(routed, "SELECT own.* FROM (", ") AS own")
    labelled = _locking(routed, "CROSS JOIN LATERAL (", ") AS routed")
    if own != expected:
        found.append(f"job_claim_available_routed locks {own} of its own, the rule {expected}")
    if labelled != {**expected, "where": (expected["where"] - OWN)
                    | {"label_set_id = sets.id"}}:
        found.append(f"job_claim_available_routed locks {labelled} of a label set, the rule "
                     f"{expected}")
    kept = routed.split("locked AS MATERIALIZED (", 1)[1].split("), gate", 1)[0]
    if " ".join(kept.split()) != ("SELECT * FROM candidates ORDER BY priority DESC, "
                                  "claim_at, created_at LIMIT %(limit)s"):
        found.append(f"job_claim_available_routed keeps {kept}")
    for name in ("job_claim_available", "job_claim_by_id", "job_claim_available_routed"):
        statement = getattr(postgresql, name)
        if _gate(statement)["where"] != gate["where"]:
            found.append(f"{name}'s gate is {_gate(statement)['where']}, the rule's "
                         f"{gate['where']}")
    for name in ("job_claim_available", "job_claim_available_routed"):
        answered = getattr(postgresql, name).rsplit("ORDER BY", 1)[1].split()
        if _terms(" ".join(answered)) != expected["order"]:
            found.append(f"{name} answers in {answered}, the rule's {expected}")
    return found


@pytest.mark.postgres_only
def test_the_claim_statements_say_what_the_rule_says():
    expected, _named, _gate = _orm()
    assert expected["order"] == ["priority DESC", "COALESCE(fair_at, available_at)", "created_at"]
    assert expected["lock"] == "FOR NO KEY UPDATE SKIP LOCKED" and expected["limited"]
    assert rule_mismatches() == []


@pytest.mark.postgres_only
def test_a_condition_added_to_the_rule_fails_until_the_statements_say_it(monkeypatch):
    """The pin is live: a new job condition (say, labels), or a new agent condition, makes the
    comparison fail, naming the statements that must change."""
    from django.db.models import Q

    monkeypatch.setattr(claimrule, "JOB_CONDITIONS", claimrule.JOB_CONDITIONS + (
        claimrule.Condition("high_enough", lambda: Q(priority__gte=0), "a test condition"),))
    assert [m.split()[0] for m in rule_mismatches()] == [
        "job_claim_available", "job_claim_by_id", "job_claim_available_routed",
        "job_claim_available_routed"]
    monkeypatch.undo()
    monkeypatch.setattr(claimrule, "AGENT_CONDITIONS", claimrule.AGENT_CONDITIONS + (
        claimrule.Condition("named", lambda: ~Q(name=""), "a test condition"),))
    assert [m.split()[0] for m in rule_mismatches()] == [
        "job_claim_available's", "job_claim_by_id's", "job_claim_available_routed's"]


def _now_plus(seconds):
    return Job.objects.annotate(t=NowPlusSeconds(seconds)).values_list("t", flat=True)[0]


def test_unmet_names_each_condition_that_keeps_a_job_from_a_claim():
    agent = JobAgentFactory()
    ready = JobFactory(job_agent=agent)
    later = JobFactory(job_agent=agent)
    Job.objects.filter(id=later.id).update(available_at=NowPlusSeconds(600))
    gone = JobFactory(job_agent=agent)
    Job.objects.filter(id=gone.id).update(expires_at=NowPlusSeconds(-1),
                                          available_at=NowPlusSeconds(600))
    running = JobFactory(job_agent=agent)
    lifecycle.claim_job(agent, running.id)
    assert claimrule.unmet(ready.id) == []
    assert claimrule.unmet(later.id) == ["available"]
    assert claimrule.unmet(gone.id) == ["available", "not_expired"]
    assert claimrule.unmet(running.id) == ["queued"]
    assert claimrule.unmet(uuid.uuid4()) is None
    lifecycle.pause_job_agent(agent, "operator:test")
    assert claimrule.unmet(ready.id) == ["agent_not_paused"]
    # What unmet() says is what a claim does: nothing while paused, then the ready job only.
    assert lifecycle.claim_next_jobs(agent, 10) == []
    lifecycle.resume_job_agent(agent, "operator:test")
    assert [g.job.id for g in lifecycle.claim_next_jobs(agent, 10)] == [ready.id]


def test_the_wakeup_recheck_finds_the_agents_a_claim_would_serve():
    busy, idle, paused = JobAgentFactory(), JobAgentFactory(), JobAgentFactory()
    JobFactory(job_agent=busy)
    later = JobFactory(job_agent=idle)
    Job.objects.filter(id=later.id).update(available_at=NowPlusSeconds(600))
    JobFactory(job_agent=paused)
    lifecycle.pause_job_agent(paused, "operator:test")
    found = claimrule.agents_with_claimable_jobs([busy.id, idle.id, paused.id])
    assert found == [busy.id]
    assert Job.objects.filter(claimrule.claimable()).count() == 2  # busy's and paused's
    assert all(isinstance(c.doc, str) and c.doc for c in claimrule.JOB_CONDITIONS
               + claimrule.AGENT_CONDITIONS)
    assert dt.timedelta(seconds=0) < _now_plus(60) - _now_plus(0)
    # Each agent's own jobs are probed (EXISTS: the first claimable one), not all read: a
    # DISTINCT over them (with the model's ordering, DISTINCT job_agent_id, created_at) read
    # and sorted every claimable job of the agents (~100 ms at 10,000 queued).
    for _ in range(3):
        JobFactory(job_agent=busy)
    with CaptureQueriesContext(connection) as queries:
        assert claimrule.agents_with_claimable_jobs([busy.id, idle.id]) == [busy.id]
    (own,) = [q["sql"] for q in queries.captured_queries if '"job"' in q["sql"]]
    assert "EXISTS" in own and "DISTINCT" not in own, own
