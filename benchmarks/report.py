"""The suite's results: benchmarks/results/latest.json (every sample) and latest.md, and the
tables in docs/performance.md between the bench markers, rewritten on each run.

Scenarios not run this time keep their latest results from latest.json (each says when it
was measured); `--no-write` prints the tables of this run only.
"""

from __future__ import annotations

import json
import subprocess

from benchmarks.common import ROOT
from benchmarks.scenarios import SCENARIOS

RESULTS_DIR = ROOT / "benchmarks" / "results"
DOC = ROOT / "docs" / "performance.md"
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def _int_keys(value):
    """JSON turned our integer keys (concurrency, sizes, batch sizes) into strings."""
    if isinstance(value, dict):
        return {(int(k) if isinstance(k, str) and k.isdigit() else k): _int_keys(v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [_int_keys(v) for v in value]
    return value


def keep_previous(results):
    """Add the latest results of every scenario not run this time (latest.json)."""
    previous = RESULTS_DIR / "latest.json"
    if previous.exists():
        old = json.loads(previous.read_text()).get("scenarios", {})
        for name, value in old.items():
            if name not in results["scenarios"]:
                results["scenarios"][name] = _int_keys(value)


def markdown(results):
    started = results["started_at"]
    lines = [
        f"Last run {started} on {results['machine']}; PostgreSQL {results['postgres']}. "
        f"Sizes: {json.dumps(results['sizes'])}.",
        "",
    ]
    for key, scenario in SCENARIOS.items():
        if key in results["scenarios"]:
            res = results["scenarios"][key]
            when = f" (measured {res['measured_at']})" if res.get("measured_at") else ""
            lines += [f"### {scenario.TITLE}{when}", "", *scenario.table(res), ""]
    return "\n".join(lines)


def write_outputs(results):
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    text = json.dumps(results, indent=1, default=str)
    (RESULTS_DIR / "latest.json").write_text(text + "\n")
    md = markdown(results)
    (RESULTS_DIR / "latest.md").write_text(md + "\n")
    if DOC.exists():
        doc = DOC.read_text()
        if BEGIN in doc and END in doc:
            head, rest = doc.split(BEGIN, 1)
            _, tail = rest.split(END, 1)
            DOC.write_text(f"{head}{BEGIN}\n{md}\n{END}{tail}")
    return md


def git_commit():
    """The commit measured (with `+changes` when the code differs from it: anything tracked
    but the result files)."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True,
                              text=True).stdout.strip()

    commit = git("rev-parse", "--short=12", "HEAD") or "unknown"
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".",
                  ":!benchmarks/results", ":!docs")
    return commit + ("+changes" if changed else "")
