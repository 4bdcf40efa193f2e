"""What the docs promise a newcomer, checked against the code: every metric the alert rules
use is in the README's table, api.md lists each endpoint once, the README's agent steps add
up, and every link to a section lands on one. The README's commands themselves run in
tests/e2e/test_newcomer.py."""

import re
from collections import Counter

from tests.utils import ROOT

README = (ROOT / "README.md").read_text()


def metric_table() -> set[str]:
    section = README[README.index("**`/metrics`**"):]
    section = section[:section.index("\n\n", section.index("| metric |"))]
    return set(re.findall(r"`(jobqueue_[a-z_]+)", section))


def test_the_readme_metrics_table_has_every_metric_the_server_serves_and_the_rules_use():
    table = metric_table()
    rules = (ROOT / "docs" / "ops" / "prometheus-rules.yml").read_text()
    used = {re.sub(r"_(count|bucket|sum)$", "", m) for m in re.findall(r"jobqueue_[a-z_]+", rules)}
    assert used - table == set()
    source = (ROOT / "ops" / "metrics.py").read_text()
    served = set(re.findall(r'"(jobqueue_[a-z_]+)"', source))
    counters = set(re.findall(r'_counter\(\s*"(jobqueue_[a-z_]+)"', source))
    served = {f"{m}_total" if m in counters else m for m in served}
    # reaped / reaper_runs are counters read from the database (their own _total in the table)
    served = {m if m in table or f"{m}_total" not in table else f"{m}_total" for m in served}
    assert served - table == set()


def test_api_md_lists_each_endpoint_once():
    api = (ROOT / "docs" / "api.md").read_text()
    section = api[api.index("## Endpoints"):api.index("**Pages.**")]
    rows = re.findall(r"^\| `([A-Z]+) ([^`]+)", section, re.M)
    twice = [row for row, n in Counter(rows).items() if n > 1]
    # claim-next has a row per body it takes (one job, a batch, a held wait): one endpoint.
    assert rows and twice == [("POST", "job-agents/{agent_id}/jobs/claim")]


def test_the_agent_steps_add_up():
    paste = README[README.index("In a second terminal"):]
    block = paste[paste.index("```sh"):paste.index("```", paste.index("```sh") + 5)]
    exports = re.findall(r"^export (\w+)=", block, re.M)
    said = re.search(r"paste the (\w+) values it printed into these (\w+) exports",
                     paste).groups()
    words = {"four": 4, "five": 5}
    assert words[said[1]] == len(exports)
    printed = README[README.index("Demo credentials ("):]
    printed = printed[:printed.index("Admin login")]
    assert words[said[0]] == len(re.findall(r"^  \w+ ", printed, re.M))
    # Every variable the agent hands a job is documented once, in a bullet of its own list.
    for variable in ("JOB_ARTIFACTS_DIR", "JOB_RESULT_FILE", "JOB_CONTEXT_FILE",
                     "JOB_CHECKPOINT_OUT", "JOB_CHECKPOINT_FILE"):
        assert variable in README
    for line in README.splitlines():  # no bullet continues another's sentence
        assert not line.startswith("  up to 1 MiB, and it becomes"), line


def test_the_readme_says_what_a_newcomer_needs():
    assert "make install-dev\n.venv/bin/pytest tests/unit" in README
    assert "createdb -h 127.0.0.1 -U postgres jobqueue\n" \
           "DATABASE_URL=postgres://postgres@127.0.0.1:5432/jobqueue make run" in README
    assert "make run PORT=8001" in README


def anchors(markdown: str) -> set[str]:
    out = set()
    for heading in re.findall(r"^#+ (.+)$", markdown, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        out.add(slug)
    return out


def test_links_to_sections_land_on_one():
    docs = [ROOT / "README.md", ROOT / "clients" / "python" / "README.md",
            *sorted((ROOT / "docs").glob("*.md"))]
    for doc in docs:
        for target, anchor in re.findall(r"\]\(([^)#\s]*\.md)#([\w-]+)\)", doc.read_text()):
            path = (doc.parent / target).resolve()
            assert path.exists(), (doc, target)
            assert anchor in anchors(path.read_text()), (doc.name, target, anchor)
