"""The `core` scenario: drain no-op jobs at each concurrency (BENCH_CORE_CONCURRENCY): the
project's lifecycle (per job and in batches) next to pgbench (the machine's limit), raw
psycopg loops and the peers, each in its configuration of benchmarks.peers.CONFIGS.
"""

from __future__ import annotations

from benchmarks import peers as peer_configs
from benchmarks.common import db_name, drop_database, log, median
from benchmarks.scenarios.drains import (
    DRAINS,
    Bracketed,
    describe,
    noise,
    noise_line,
    peer_version,
    run_peer,
    run_project_drain,
)
from benchmarks.servers import setup_pgbench
from benchmarks.sizes import conf

TITLE = "Core cycle on PostgreSQL"

PEER_LABELS = {  # {v}: the peer's version in the run
    "pgqueuer_b1": "pgqueuer {v}, batch 1",
    "pgqueuer_b10": "pgqueuer {v}, its default batch (10)",
    "procrastinate": "procrastinate {v}",
    "djtasks": "django-tasks-db {v}",
}
CORE_SYSTEMS = [
    ("pgbench", "pgbench: one single-row UPDATE by primary key per transaction (the limit)"),
    ("raw_cte", "raw psycopg, the lifecycle's SQL on PostgreSQL: one CTE per phase, 2 round "
     "trips a job (same SQL shape, no Django)"),
    ("raw_shape", "raw psycopg, the ORM path's statements (12 round trips a job, 2 commits)"),
    ("jobqueue", "jobqueue lifecycle: claim-next + terminal report"),
    ("jobqueue_b10", "jobqueue lifecycle: batch claim of 10 + a report per job"),
    ("jobqueue_b10_ack", "jobqueue lifecycle: batch claim of 10, then one batch report "
     "(report_many)"),
    ("jobqueue_b10_pipe", "jobqueue lifecycle: batch claim of 10, batch reports sent by a second "
     "thread meanwhile (the reference agent's shape)"),
    *PEER_LABELS.items(),
]
SLOW_PEERS = ("procrastinate", "djtasks")


def run(peers=True):
    """Every system drains the same jobs at each concurrency, pgbench between drains."""
    n, reps = conf("BENCH_CORE_JOBS"), conf("BENCH_REPS")
    levels = conf("BENCH_CORE_CONCURRENCY")
    secs = conf("BENCH_PGBENCH_SECONDS")
    setup_pgbench()
    raw: dict = {key: {c: [] for c in levels} for key, _ in CORE_SYSTEMS}
    ratios: dict = {key: {c: [] for c in levels} for key, _ in CORE_SYSTEMS}
    for rep in range(reps):
        for c in levels:
            runs = {
                "raw_shape": lambda c=c: run_project_drain("raw_shape", c, n),
                "raw_cte": lambda c=c: run_project_drain("raw_cte", c, n),
                "jobqueue": lambda c=c: run_project_drain("core", c, n, 1),
                "jobqueue_b10": lambda c=c: run_project_drain("core", c, n, 10),
                "jobqueue_b10_ack": lambda c=c: run_project_drain("core", c, n, 10, "batch"),
                "jobqueue_b10_pipe": lambda c=c: run_project_drain("core", c, n, 10,
                                                                   "pipelined"),
            }
            if peers:
                for key in PEER_LABELS:
                    if key in SLOW_PEERS and rep >= (conf("BENCH_SLOW_PEER_REPS") or reps):
                        continue
                    runs[key] = lambda c=c, key=key: run_peer(peer_configs.CONFIGS[key], c, n)
            level = Bracketed(c, secs)
            for key, fn in runs.items():
                value, ratio = level.measure(fn, f"core c={c} {key}")
                raw[key][c].append(value)
                ratios[key][c].append(ratio)
                log(f"core rep {rep + 1}/{reps} c={c} {key}: {value:,.0f}/s ({ratio:.3f} of "
                    f"pgbench {level.pgbench[-2]:,.0f}-{level.pgbench[-1]:,.0f})")
            raw["pgbench"][c] += level.pgbench
    drop_database(db_name("pgbench"))
    med = {key: {c: median(v) for c, v in by_c.items() if v} for key, by_c in raw.items()}
    return {"jobs": n, "reps": reps, "slow_peer_reps": conf("BENCH_SLOW_PEER_REPS") or reps,
            "levels": levels, "raw": raw, "ratios_adjacent": ratios, "median": med,
            "noise": noise(raw["pgbench"]), "drains": list(DRAINS),
            "peer_configs": {k: peer_configs.CONFIGS[k] for k in PEER_LABELS} if peers else {}}


def table(res):
    levels, med = res["levels"], res["median"]
    versions = res.get("versions", {})
    small = ("**A small run** (the targets are read from 20,000 jobs a drain, 3 runs). "
             if res["jobs"] < 20_000 else "")
    lines = [
        small + f"Drain of {res['jobs']:,} no-op jobs per run, median of {res['reps']} runs, "
        "jobs/s (pgbench: transactions/s), timed from the moment every worker is ready to "
        "the last completion the database recorded; in brackets the ratio to pgbench (the "
        "median of its runs between this level's drains) and to the raw psycopg loop of the "
        "same SQL shape (the lifecycle's statements on PostgreSQL); "
        "the batch rows also give the ratio to pgqueuer at its default batch."
        + (f" procrastinate and django-tasks-db: median of {res['slow_peer_reps']} run(s)."
           if res.get("slow_peer_reps", res["reps"]) != res["reps"] else ""),
        "",
        "| system | " + " | ".join(f"c={c}" for c in levels) + " |",
        "|---|" + "---|" * len(levels),
    ]
    # Ratios to the median of the level's pgbench runs; the other ratios divide those.
    norm = {k: {lv: x / med["pgbench"][lv] for lv, x in by.items() if med["pgbench"].get(lv)}
            for k, by in med.items() if k != "pgbench"}
    for key, label in CORE_SYSTEMS:
        if not med.get(key):
            continue
        if key in PEER_LABELS:
            config = res.get("peer_configs", {}).get(key)
            label = label.format(v=peer_version(config, versions) if config else "")
        cells = []
        for c in levels:
            v = med[key].get(c)
            if v is None:
                cells.append("")
                continue
            r = norm.get(key, {}).get(c)
            shape = norm.get("raw_cte", {}).get(c)
            cell = f"{v:,.0f}"
            if key != "pgbench" and r:
                cell += f" ({r:.2f}"
                cell += f"; {r / shape:.2f}× raw" if shape and key != "raw_cte" else ""
                peer = norm.get("pgqueuer_b10", {}).get(c)
                if key.startswith("jobqueue_b10") and peer:
                    cell += f"; {r / peer:.2f}× pgqueuer b10"
                cell += ")"
            cells.append(cell)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", noise_line(res), ""] if res.get("noise") else [""]
    if res.get("peer_configs"):
        lines.append("How each peer ran (`benchmarks.peers.CONFIGS`):")
        lines += [f"- {PEER_LABELS[k].format(v=peer_version(cfg, versions))}: {describe(cfg)}"
                  for k, cfg in res["peer_configs"].items()]
    if res.get("commit"):
        lines += ["", f"jobqueue at commit {res['commit']}."]
    return lines
