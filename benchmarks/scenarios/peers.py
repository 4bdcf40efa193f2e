"""The `peers` scenario: each peer in every configuration of benchmarks.peers.SWEEP (driver,
event loop, batch size, processes vs in-process consumers, connection reuse), to choose and
show the best; BENCH_PEERS_CONCURRENCY levels, BENCH_PEERS_REPS runs.
"""

from __future__ import annotations

import json

from benchmarks import peers as peer_configs
from benchmarks.common import db_name, drop_database, log, median
from benchmarks.scenarios.drains import DRAINS, Bracketed, noise, noise_line, run_peer
from benchmarks.servers import setup_pgbench
from benchmarks.sizes import conf

TITLE = "Each peer's configurations"


def run():
    """Every configuration of benchmarks.peers.SWEEP at each level, pgbench between drains,
    to pick (and show) each peer's best: BENCH_CORE_JOBS jobs a drain, BENCH_PEERS_REPS
    runs."""
    n, reps = conf("BENCH_CORE_JOBS"), conf("BENCH_PEERS_REPS")
    levels, secs = conf("BENCH_PEERS_CONCURRENCY"), conf("BENCH_PGBENCH_SECONDS")
    setup_pgbench()
    pgbench: dict = {c: [] for c in levels}
    raw: dict = {system: {label: {c: [] for c in levels} for label in sweep}
                 for system, sweep in peer_configs.SWEEP.items()}
    ratios: dict = {system: {label: {c: [] for c in levels} for label in sweep}
                    for system, sweep in peer_configs.SWEEP.items()}
    for rep in range(reps):
        for c in levels:
            level = Bracketed(c, secs)
            seen = set()
            for system, sweep in peer_configs.SWEEP.items():
                for label, cfg in sweep.items():
                    config = {"system": system, **cfg}
                    shape = json.dumps({**config, "processes": peer_configs.split(config, c)},
                                       sort_keys=True)
                    if shape in seen:  # e.g. "one process" at c=1: measured already
                        continue
                    seen.add(shape)
                    value, ratio = level.measure(
                        lambda config=config, c=c: run_peer(config, c, n),
                        f"peers c={c} {system} {label}")
                    raw[system][label][c].append(value)
                    ratios[system][label][c].append(ratio)
                    log(f"peers rep {rep + 1}/{reps} c={c} {system} [{label}]: {value:,.0f}/s "
                        f"({ratio:.3f} of pgbench)")
            pgbench[c] += level.pgbench
    drop_database(db_name("pgbench"))

    def medians(values):
        return {system: {label: {c: median(v) for c, v in by_c.items() if v}
                         for label, by_c in rows.items()} for system, rows in values.items()}

    return {"jobs": n, "reps": reps, "levels": levels, "pgbench": pgbench,
            "noise": noise(pgbench), "raw": raw, "ratios_adjacent": ratios,
            "median": medians(raw), "sweep": peer_configs.SWEEP, "drains": list(DRAINS),
            "chosen": peer_configs.CONFIGS}


def table(res):
    levels = res["levels"]
    lines = [
        f"Each peer in each configuration: drain of {res['jobs']:,} no-op jobs, "
        f"median of {res['reps']} run(s): jobs/s and (in brackets) the ratio to the median "
        "of the level's pgbench runs (run between the drains); timed from every worker ready "
        "to the last completion the database recorded. Best per level in bold. c = consumers in "
        "all (worker processes × consumers per process); an empty cell is the same shape as "
        "a row above.",
        "",
        "| peer | configuration | " + " | ".join(f"c={c}" for c in levels) + " |",
        "|---|---|" + "---|" * len(levels),
    ]
    names = {"pgqueuer": "pgqueuer", "procrastinate": "procrastinate",
             "djtasks": "django-tasks-db"}
    limit = {c: median(v) for c, v in res["pgbench"].items() if v}
    for system, rows in res["median"].items():
        best = {c: max((r.get(c, 0) for r in rows.values()), default=0) for c in levels}
        for label, by_c in rows.items():
            cells = []
            for c in levels:
                v = by_c.get(c)
                if v is None:
                    cells.append("")
                    continue
                cell = f"{v:,.0f} ({v / limit[c]:.3f})" if limit.get(c) else f"{v:,.0f}"
                cells.append(f"**{cell}**" if v == best[c] and len(rows) > 1 else cell)
            lines.append(f"| {names[system]} | {label} | " + " | ".join(cells) + " |")
    lines += ["", noise_line(res)]
    return lines
