"""What each lever on #26's WAL target would save, measured before it is built
(`make bench BENCH_ARGS=wal_levers`; docs/performance.md, "What reaching the WAL target takes").

The `wal` scenario measures the shipped code over the API. This one runs the hot statements
themselves (jobqueue/sql/postgresql.sql, as the backend runs them: claim-next + single report,
and a claim of 10 + one batch report) on one connection, in the project's database, under
variants that each change the schema or cut a part of a statement, and reads the WAL they
write the way benchmarks.wal does (pg_waldump's records naming this database, per job, after
a warm-up drain and a CHECKPOINT). A variant is a what-if, not a design.

Since the `claimed` and `status_reported` events are read from the job row (jobqueue/
timeline.py), the shipped statements write no event for a job of this drain; the variants
that cut them (`no_events`) are gone with them.

    as shipped           the statements and the schema of this checkout
    indexes              job_workspace_status_idx partial on live jobs (a finished job's
                         version leaves it; the plain job_agent_id index is gone since
                         migration 0036, which made job_agent_id this index's third column)
    indexes_gate         and no FOR SHARE gate on the agent row (its row lock)
    indexes_fk           the index changes, and no foreign key from job_claim to job (the
                         KEY SHARE lock its check takes on the job row a claim just wrote)
"""

from __future__ import annotations

import json
import re

from benchmarks.wal import breakdown

PATHS = ("single", "batch")
BATCH = 10

_DROP_INDEXES = [
    "DROP INDEX IF EXISTS job_workspace_status_idx",
    "CREATE INDEX IF NOT EXISTS job_workspace_status_idx ON job (workspace_id, status, "
    "job_agent_id) WHERE completed_at IS NULL",
]


def cut_cte(text: str, name: str) -> str:
    """`text` without its CTE `name AS (...)` (and the comma before it)."""
    start = re.search(rf"\b{name} AS (MATERIALIZED )?\(", text).start()
    depth, at = 0, text.index("(", start)
    while True:
        depth += {"(": 1, ")": -1}.get(text[at], 0)
        if depth == 0:
            break
        at += 1
    return text[:text.rindex(",", 0, start)] + text[at + 1:]


def cut_gate(text: str) -> str:
    """The claim without its gate on the agent row."""
    return cut_cte(text, "gate").replace("FROM locked, gate WHERE", "FROM locked WHERE")


def statements(variant: str) -> dict:
    from jobqueue.lifecycle.pg import claim_statement
    from jobqueue.sql import postgresql as sql

    out = {"claim1": claim_statement(1), f"claim{BATCH}": claim_statement(BATCH),
           "report": sql.job_set_state_if_running, "report_many": sql.job_set_state_if_running_many}
    if variant == "indexes_gate":
        out = {name: cut_gate(text) if name.startswith("claim") else text
               for name, text in out.items()}
    return out


_DROP_CLAIM_FK = (
    "DO $$ DECLARE c text; BEGIN "
    "SELECT conname INTO c FROM pg_constraint WHERE conrelid = 'job_claim'::regclass "
    "AND confrelid = 'job'::regclass AND contype = 'f'; "
    "EXECUTE format('ALTER TABLE job_claim DROP CONSTRAINT %%I', c); END $$"
)

VARIANTS = {
    "as shipped": [],
    "indexes": _DROP_INDEXES,
    "indexes_gate": _DROP_INDEXES,
    "indexes_fk": [*_DROP_INDEXES, _DROP_CLAIM_FK],
}


def _drain(cur, texts, path, agent, n):
    claim_params = {"agent": agent, "limit": 1 if path == "single" else BATCH, "lease": 60,
                    "kind": "claimed", "actor": f"agent:{agent}", "holder": "", "key": None}
    done = 0
    while done < n:
        if path == "single":
            cur.execute(texts["claim1"], claim_params)
            rows = cur.fetchall()
            at = [c[0] for c in cur.description].index("last_claim_id")
            for row in rows:
                cur.execute(texts["report"], {
                    "status": "successful", "message": None, "result": None,
                    "external_id": None, "job": row[0], "claim": row[at], "agent": agent,
                    "workspace": None, "kind": "status_reported", "actor": f"agent:{agent}",
                    "detail": json.dumps({"status": "successful", "has_result": False})})
                if cur.fetchone() is None:
                    raise RuntimeError(f"wal_levers: the report of {row[0]} was refused")
        else:
            cur.execute(texts[f"claim{BATCH}"], claim_params)
            rows = cur.fetchall()
            at = [c[0] for c in cur.description].index("last_claim_id")
            cur.execute(texts["report_many"], {
                "jobs": [r[0] for r in rows], "claims": [r[at] for r in rows],
                "statuses": ["successful"] * len(rows), "messages": None, "results": None,
                "external_ids": None, "retries": None, "backoff": 1.0, "backoff_cap": 60.0,
                "jitter": 0.0, "message_chars": 200, "agent": agent, "workspace": None,
                "kind": "status_reported", "actor": f"agent:{agent}"})
            assert len(cur.fetchall()) == len(rows)
        if not rows:
            raise RuntimeError(f"wal_levers {path}: drained {done} of {n}")
        done += len(rows)


def measure(n: int) -> dict:
    """{"jobs": n, "variants": {variant: {path: {"bytes": per job, "images": of them
    full-page images, "parts": [(record, relation, bytes)]}}}}, each variant on a freshly
    migrated database."""
    from django.db import connection

    from benchmarks.project import insert_jobs, make_agent, migrate, reset_tables, sql

    out: dict = {}
    for variant, schema in VARIANTS.items():
        connection.close()
        migrate()
        for statement in schema:
            sql(statement)
        texts = statements(variant)
        out[variant] = {}
        for path in PATHS:
            reset_tables()
            agent = make_agent()
            ((dboid, data_dir),) = sql("SELECT oid, current_setting('data_directory') FROM "
                                       "pg_database WHERE datname = current_database()",
                                       fetch=True)
            names = dict(sql("SELECT pg_relation_filenode(oid), relname FROM pg_class "
                             "WHERE pg_relation_filenode(oid) IS NOT NULL", fetch=True))
            connection.ensure_connection()
            with connection.cursor() as cur:
                insert_jobs(agent, 200)
                _drain(cur, texts, path, agent.id, 200)
                insert_jobs(agent, n)
                sql("ANALYZE job")
                sql("CHECKPOINT")
                start = sql("SELECT pg_current_wal_insert_lsn()::text", fetch=True)[0][0]
                _drain(cur, texts, path, agent.id, n)
                end = sql("SELECT pg_current_wal_insert_lsn()::text", fetch=True)[0][0]
            parts = breakdown(start, end, dboid, names, data_dir) or {}
            out[variant][path] = {
                "bytes": sum(b for b, _c, _f in parts.values()) / n,
                "images": sum(f for _b, _c, f in parts.values()) / n,
                "parts": sorted(((k, rel, b / n) for (k, rel), (b, _c, _f) in parts.items()),
                                key=lambda p: -p[2])[:8],
            }
    connection.close()
    migrate()  # the shipped schema again, for the scenarios run after this one
    return {"jobs": n, "variants": out}


def table(res: dict) -> list[str]:
    targets = {"single": 1500, "batch": 1200}
    lines = ["| variant | single path (bytes a job) | of them, full-page images | "
             "batch path | of them, full-page images |", "| --- | ---: | ---: | ---: | ---: |"]
    for variant, paths in res["variants"].items():
        cells = [f"{paths[p]['bytes']:,.0f} | {paths[p]['images']:,.0f}" for p in PATHS]
        lines.append(f"| {variant} | {' | '.join(cells)} |")
    lines.append(f"| target | ≤ {targets['single']:,} | | ≤ {targets['batch']:,} | |")
    return lines


__all__ = ["VARIANTS", "cut_cte", "measure", "table"]
