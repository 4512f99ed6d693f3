"""docker/grafana/sluice.json and docker/prometheus/rules.yml: a well-formed dashboard, and every
metric they name is one the code declares and docs/metrics.md lists. (That the kept dashboard is the one
sluice/dashboard.py generates, and that its expressions return data from a real stack, is checked in
tests/e2e/test_observability.py.)"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml

from tests.deploy.checks import ROOT

DASHBOARD = ROOT / "docker" / "grafana" / "sluice.json"
RULES = ROOT / "docker" / "prometheus" / "rules.yml"
METRICS_DOC = ROOT / "docs" / "metrics.md"
#: Where the processes declare their metrics (the dashboard's own module is left out: it only reads them).
CODE = ("app", "core", "router", "workers", "planner")
_METRIC = re.compile(r"\bsluice_[a-z0-9_]+\b")
_SERIES_SUFFIXES = ("_bucket", "_sum", "_count")


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def _expressions(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def _rule_expressions() -> list[str]:
    return [r["expr"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def _declared() -> set[str]:
    return {name for package in CODE for path in (ROOT / package).rglob("*.py")
            for name in re.findall(r"[\"'](sluice_[a-z0-9_]+)[\"']", path.read_text())}


def _family(series: str) -> str:
    """The metric a series belongs to: a histogram's ``_bucket``/``_sum``/``_count`` stripped."""
    for suffix in _SERIES_SUFFIXES:
        if series.endswith(suffix):
            return series.removesuffix(suffix)
    return series


def test_panels_have_unique_ids_and_do_not_overlap(dashboard: dict[str, Any]) -> None:
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    boxes = [(p["gridPos"]["x"], p["gridPos"]["y"], p["gridPos"]["w"], p["gridPos"]["h"]) for p in panels]
    assert all(x + w <= 24 for x, _, w, _ in boxes)
    overlapping = [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:]
                   if a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and a[1] < b[1] + b[3] and b[1] < a[1] + a[3]]
    assert overlapping == []
    assert [p["gridPos"]["y"] for p in panels] == sorted(p["gridPos"]["y"] for p in panels), "in reading order"


def test_every_metric_named_is_declared_by_the_code_and_documented(dashboard: dict[str, Any]) -> None:
    declared, documented = _declared(), set(re.findall(r"`(sluice_[a-z0-9_]+)`", METRICS_DOC.read_text()))
    named = {m for expr in _expressions(dashboard) + _rule_expressions() for m in _METRIC.findall(expr)}
    assert named, "the pattern finds the metrics"
    # prometheus_client adds `_total` to a counter named without it.
    undeclared = [m for m in named if not {m, _family(m), m.removesuffix("_total")} & declared]
    assert sorted(undeclared) == []
    assert sorted(m for m in named if _family(m) not in documented) == []


def test_the_kv_tiers_row_shows_every_tier_metric(dashboard: dict[str, Any]) -> None:
    panels = dashboard["panels"]
    (row,) = [i for i, p in enumerate(panels) if p["type"] == "row" and p["title"] == "KV tiers"]
    following = [i for i, p in enumerate(panels) if p["type"] == "row" and i > row]
    exprs = " ".join(t["expr"] for p in panels[row + 1:following[0] if following else None] for t in p["targets"])
    assert "sum by (worker, tier) (sluice_worker_kv_tier_blocks)" in exprs
    for counter, by in (("hits", "tier"), ("offloaded_bytes", "tier"), ("onboarded_bytes", "tier"),
                        ("recomputes", "reason")):
        assert re.search(rf"sum by \({by}\) \(rate\(sluice_worker_kv_tier_{counter}_total\[", exprs), counter
    for q in ("0.5", "0.99"):
        assert f"histogram_quantile({q}, sum by (le, tier) (rate(sluice_worker_kv_tier_onboard_seconds_bucket[" in exprs


def test_an_alert_watches_failing_tier_reads() -> None:
    alerts = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r]
    (tier,) = [a for a in alerts if "sluice_worker_kv_tier_recomputes_total" in a["expr"]]
    assert re.search(r'reason=~"(down\|corrupt|corrupt\|down)"', tier["expr"]) and "rate(" in tier["expr"]
    assert tier["for"] and tier["labels"]["severity"] in {"warning", "critical"}
