"""The benchmark suite's writer (benchmarks/report.py) and its registry of scenarios
(benchmarks/scenarios): every scenario renders its section under its title, in the order
docs/performance.md prints them; a run rewrites only the doc's bench section; scenarios not
run keep their latest results. No database: the results are the committed latest.json."""

import json
import re
from pathlib import Path

import pytest

from benchmarks import report, run
from benchmarks.scenarios import SCENARIOS

ROOT = Path(__file__).resolve().parents[2]
LATEST = ROOT / "benchmarks" / "results" / "latest.json"


def latest() -> dict:
    return report._int_keys(json.loads(LATEST.read_text()))


def test_every_scenario_has_a_run_a_table_and_a_title():
    for name, module in SCENARIOS.items():
        assert module.__name__ == f"benchmarks.scenarios.{name}"
        assert callable(module.run) and callable(module.table) and module.TITLE
    assert len({m.TITLE for m in SCENARIOS.values()}) == len(SCENARIOS)


def test_the_default_scenarios_are_known():
    assert set(run.DEFAULT_SCENARIOS) <= set(SCENARIOS)


def test_markdown_prints_each_scenario_under_its_title_in_the_docs_order():
    results = latest()
    md = report.markdown(results)
    titles = re.findall(r"^### (.+?)(?: \(measured [^)]*\))?$", md, flags=re.M)
    expected = [m.TITLE for name, m in SCENARIOS.items() if name in results["scenarios"]]
    assert titles == expected
    assert len(titles) == len(results["scenarios"])  # every scenario of the file has a section
    assert md.startswith(f"Last run {results['started_at']} on {results['machine']}")


@pytest.fixture
def outputs(tmp_path, monkeypatch):
    doc = tmp_path / "performance.md"
    monkeypatch.setattr(report, "RESULTS_DIR", tmp_path / "results")
    monkeypatch.setattr(report, "DOC", doc)
    return tmp_path


def test_write_outputs_rewrites_only_the_bench_section(outputs):
    doc = outputs / "performance.md"
    doc.write_text(f"# Before\n\n{report.BEGIN}\nold tables\n{report.END}\n\nAfter.\n")
    results = latest()
    md = report.write_outputs(results)
    assert doc.read_text() == f"# Before\n\n{report.BEGIN}\n{md}\n{report.END}\n\nAfter.\n"
    assert (outputs / "results" / "latest.md").read_text() == md + "\n"
    written = json.loads((outputs / "results" / "latest.json").read_text())
    assert report._int_keys(written) == results


def test_keep_previous_adds_the_scenarios_not_run_with_their_integer_keys(outputs):
    (outputs / "results").mkdir()
    (outputs / "results" / "latest.json").write_text(json.dumps({"scenarios": {
        "reaper": {"claims": 5, "runs": {"100": {"seconds": 1.0}}},
        "growth": {"old": True},
    }}))
    results = {"scenarios": {"growth": {"new": True}}}
    report.keep_previous(results)
    assert results["scenarios"] == {"growth": {"new": True},
                                    "reaper": {"claims": 5, "runs": {100: {"seconds": 1.0}}}}


def test_keep_previous_without_a_results_file_keeps_the_run_as_it_is(outputs):
    results = {"scenarios": {"growth": {"new": True}}}
    report.keep_previous(results)
    assert results == {"scenarios": {"growth": {"new": True}}}
