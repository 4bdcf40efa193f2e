"""What a job costs the database over the API: WAL bytes, WAL records and transactions a
job, on the single path (claim-next + PUT status) and the batch path (a claim of 10 + one
batch report), one agent against gunicorn, after a warm-up drain, creation not counted
(`make bench BENCH_ARGS=wal`; issue #26's measure, docs/performance.md "Write volume").

The WAL of the measured drain is the server's insert position after it minus before it (the
whole cluster: run it on a quiet one), and pg_waldump's records of that range that name this
database's relations, summed per relation and record type: where the bytes go, whatever
else the cluster does. Commit records name no relation; they are the difference.
"""

from __future__ import annotations

import collections
import re
import shutil
import subprocess
from pathlib import Path

PATHS = ("single", "batch")


def waldump() -> str | None:
    found = shutil.which("pg_waldump")
    if found:
        return found
    for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_waldump"), reverse=True):
        return str(candidate)
    return None


def breakdown(start: str, end: str, dboid: int, names: dict, data_dir: str) -> dict:
    """{(record type, relation): [bytes, records, bytes of full-page images]} of the WAL in
    [start, end) naming this database; None when pg_waldump is missing or cannot read the
    server's WAL. A full-page image is the first change of a page after a checkpoint; its
    share falls as the drain grows, the rest is what every job writes."""
    tool = waldump()
    if tool is None:
        return None
    out = subprocess.run([tool, "-p", f"{data_dir}/pg_wal", "-s", start, "-e", end],
                         capture_output=True, text=True)
    if out.returncode != 0 and not out.stdout:
        return None
    found: dict = collections.defaultdict(lambda: [0, 0, 0])
    for line in out.stdout.splitlines():
        m = re.search(r"rmgr: (\w+)\s+len \(rec/tot\):\s+(\d+)/\s*(\d+).*?desc: (\w+)", line)
        rels = re.findall(r"rel \d+/(\d+)/(\d+)", line)
        if not m or not rels or int(rels[0][0]) != dboid:
            continue
        key = (f"{m[1]} {m[4]}", names.get(int(rels[0][1]), rels[0][1]))
        found[key][0] += int(m[3])
        found[key][1] += 1
        # pg_waldump's rec is the record without its images; tot adds them (and headers)
        if "FPW" in line:
            found[key][2] += int(m[3]) - int(m[2])
    return dict(found)


def measure(run, n: int) -> dict:
    """One path: warm-up drain, then n jobs, CHECKPOINT'ed before (no full-page images of
    pages written before the drain are counted twice), measured."""
    from agents import credentials
    from benchmarks.project import APP_PY, insert_jobs, make_agent, reset_tables, sql
    from benchmarks.servers import start_gunicorn

    results = {}
    proc, port = start_gunicorn(1, threads=8)
    try:
        for path in PATHS:
            reset_tables()
            agent = make_agent()
            token = credentials.issue_agent_token(agent)
            base = f"http://127.0.0.1:{port}/v1/workspaces/{agent.workspace_id}/"
            cmd = [[APP_PY, "-m", "benchmarks.workers", "http_cycle", base, str(agent.id),
                    token, path]]
            insert_jobs(agent, 200)
            run(cmd)  # warm-up: connections, prepared statements, the worker's imports
            insert_jobs(agent, n)
            sql("ANALYZE job")
            sql("CHECKPOINT")
            ((dboid, data_dir),) = sql("SELECT oid, current_setting('data_directory') FROM "
                                       "pg_database WHERE datname = current_database()",
                                       fetch=True)
            names = dict(sql("SELECT pg_relation_filenode(oid), relname FROM pg_class "
                             "WHERE pg_relation_filenode(oid) IS NOT NULL", fetch=True))
            before = sql("SELECT pg_current_wal_insert_lsn()::text, xact_commit FROM "
                         "pg_stat_database WHERE datname = current_database()", fetch=True)[0]
            done = run(cmd)[0]["n"]
            after = sql("SELECT pg_current_wal_insert_lsn()::text, xact_commit, "
                        "pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s::pg_lsn) FROM "
                        "pg_stat_database WHERE datname = current_database()",
                        [before[0]], fetch=True)[0]
            if done != n:
                raise RuntimeError(f"wal {path}: drained {done} of {n}")
            parts = breakdown(before[0], after[0], dboid, names, data_dir)
            results[path] = {
                "jobs": n,
                "wal_bytes_per_job": float(after[2]) / n,
                # the statistics collector's count lags; the end-of-run ANALYZE flushes it
                "transactions_per_job": (after[1] - before[1]) / n,
                "parts": None if parts is None else sorted(
                    ([kind, rel, b / n, c / n, f / n] for (kind, rel), (b, c, f) in parts.items()),
                    key=lambda row: -row[2]),
            }
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return results


def table(res: dict) -> list[str]:
    lines = ["| path | WAL bytes a job (the cluster) | of it, naming this database | "
             "of that, full-page images | transactions a job (reads too) | target |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    targets = {"single": 1500, "batch": 1200}
    for path in PATHS:
        row = res[path]
        named = sum(p[2] for p in row["parts"]) if row["parts"] else float("nan")
        images = sum(p[4] for p in row["parts"]) if row["parts"] else float("nan")
        lines.append(f"| {path} | {row['wal_bytes_per_job']:,.0f} | {named:,.0f} | "
                     f"{images:,.0f} | "
                     f"{row['transactions_per_job']:.2f} | ≤ {targets[path]:,} |")
    for path in PATHS:
        if not res[path]["parts"]:
            continue
        lines += ["", f"Where the {path} path's bytes go (pg_waldump, a job's share):", "",
                  "| record | relation | bytes | of them, full-page images | records |",
                  "| --- | --- | ---: | ---: | ---: |"]
        for kind, rel, b, c, f in res[path]["parts"][:15]:
            lines.append(f"| {kind} | {rel} | {b:,.0f} | {f:,.0f} | {c:.2f} |")
    return lines
