"""Monitoring as code (docs/ops/): the Grafana dashboard's queries and the Prometheus rules
name only metrics that /metrics serves, and each alert this service promises is there.
(`make lint` runs `promtool check rules` on the rules: scripts/check_monitoring.sh.)"""

import json
import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.utils import ROOT

pytestmark = pytest.mark.django_db

OPS = ROOT / "docs" / "ops"
# PromQL words that look like metric names but are functions, keywords or labels.
NOT_METRICS = {"by", "without", "on", "ignoring", "group_left", "group_right", "or", "and",
               "unless", "bool", "offset", "le", "vector", "time", "sum", "max", "min", "avg",
               "count", "stddev", "stdvar", "topk", "bottomk", "quantile", "count_values",
               "group"}
SUFFIXES = {"counter": ["_total", "_created"], "histogram": ["_bucket", "_count", "_sum",
                                                             "_created"],
            "gauge": [""], "summary": ["_count", "_sum", "_created"]}


def served_names(client) -> set[str]:
    response = client.get("/metrics")
    assert response.status_code == 200
    names = set()
    for family in text_string_to_metric_families(response.content.decode()):
        names.add(family.name)
        names.update(family.name + s for s in SUFFIXES.get(family.type, [""]))
    return names


def metric_names(expr: str) -> set[str]:
    without_strings = re.sub(r'"[^"]*"', '""', expr)
    without_labels = re.sub(r"\{[^}]*\}", "", without_strings)
    without_ranges = re.sub(r"\[[^\]]*\]", "", without_labels)
    words = set(re.findall(r"\b[a-zA-Z_:][a-zA-Z0-9_:]*\b(?!\s*\()", without_ranges))
    # `by (status)` / `without (...)`: label lists, not metrics.
    labels = set(re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", without_ranges))
    label_words = {w.strip() for group in labels for w in group.split(",")}
    return {w for w in words if w not in NOT_METRICS and w not in label_words
            and not w.isdigit()}


def dashboard_exprs() -> list[str]:
    dash = json.loads((OPS / "grafana-dashboard.json").read_text())
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]


def rule_exprs() -> dict[str, str]:
    # Our rules file keeps each `expr:` on one line (promtool checks the YAML itself).
    text = (OPS / "prometheus-rules.yml").read_text()
    alerts = re.findall(r"- alert: (\w+)\n\s+expr: (.+)", text)
    return dict(alerts)


def test_the_dashboard_queries_only_metrics_that_metrics_serves(client):
    served = served_names(client)
    exprs = dashboard_exprs()
    assert len(exprs) >= 14
    used = set().union(*(metric_names(e) for e in exprs))
    assert used, exprs
    assert all(name.startswith("jobqueue_") for name in used), used
    assert used - served == set()
    # And the parser sees what a query names.
    assert metric_names('sum by (le, route) (rate(jobqueue_x_bucket{a="b"}[5m]))') == {
        "jobqueue_x_bucket"}


def test_the_alerting_rules_cover_the_promised_alerts_with_served_metrics(client):
    served = served_names(client)
    rules = rule_exprs()
    assert {"JobQueueDatabaseDown", "JobQueueReaperStale", "JobQueueExpiredLeasesPending",
            "JobQueueWebhookDeliveriesFailing", "JobQueueWaitsAtCapacity"} <= set(rules)
    for alert, expr in rules.items():
        names = metric_names(expr)
        assert names and names - served == set(), (alert, names - served)
