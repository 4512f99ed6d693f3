"""The Grafana dashboard kept in ``docker/grafana/sluice.json``, built from the panel list below
(``sluice dashboard > docker/grafana/sluice.json``; a test keeps the file equal to this).

Every expression reads series the processes export (app/metrics.py, workers/metrics.py,
workers/kvbm/metrics.py, planner/metrics.py) with the
labels Prometheus adds from service discovery (sluice.observe, router.discovery: ``worker``,
``model``, ``pool``, ``component``). ``$__rate_interval`` is Grafana's; the end-to-end test
(tests/e2e/test_observability.py) evaluates each expression against a real Prometheus.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DASHBOARD_PATH = Path(__file__).resolve().parents[1] / "docker" / "grafana" / "sluice.json"
DATASOURCE_UID = "prometheus"
RATE = "$__rate_interval"


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    title: str
    queries: tuple[Query, ...]
    unit: str = "short"
    description: str = ""
    stacked: bool = False


def _quantiles(metric: str, by: str = "") -> tuple[Query, ...]:
    group = f"le{', ' + by if by else ''}"
    suffix = f" {{{{{by}}}}}" if by else ""
    return tuple(Query(f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket[{RATE}])))", f"p{int(q * 100)}{suffix}")
                 for q in (0.5, 0.99))


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...] = field(default_factory=tuple)


ROWS: tuple[Row, ...] = (
    Row("Requests", (
        Panel("Request rate by outcome", (Query(f"sum by (outcome) (rate(sluice_requests_total[{RATE}]))",
                                                "{{outcome}}"),), "reqps", stacked=True),
        Panel("Errors by type", (Query(f"sum by (type) (rate(sluice_request_errors_total[{RATE}])) or vector(0)",
                                       "{{type}}"),),
              "reqps", "Refused or failed requests (client errors included), by OpenAI error type or code"),
        Panel("Time to first token", _quantiles("sluice_time_to_first_token_seconds"), "s"),
        Panel("Inter-token latency", _quantiles("sluice_inter_token_latency_seconds"), "s"),
        Panel("Queue time", _quantiles("sluice_request_queue_time_seconds"), "s",
              "Enqueued until a worker took the request"),
        Panel("Tokens", (
            Query(f"sum(rate(sluice_input_tokens_total[{RATE}]))", "prompt"),
            Query(f"sum(rate(sluice_cached_tokens_total[{RATE}]))", "prompt, cached"),
            Query(f"sum(rate(sluice_output_tokens_total[{RATE}]))", "generated"),
        ), "short", "Tokens per second over all models"),
        Panel("In flight and waiting", (
            Query("sum(sluice_requests_in_flight)", "in flight"),
            Query("sum(sluice_requests_waiting)", "waiting for a worker"),
        )),
        Panel("Admission refusals and migrations", (
            Query(f"sum(rate(sluice_admission_refusals_total[{RATE}])) or vector(0)", "refused (429 overloaded)"),
            Query(f"sum(rate(sluice_request_migrations_total[{RATE}])) or vector(0)", "moved to another worker"),
        ), "reqps"),
    )),
    Row("Workers", (
        Panel("KV cache usage", (Query(
            "sum by (worker) (sluice_worker_kv_blocks_used) / sum by (worker) (sluice_worker_kv_blocks_capacity)",
            "{{worker}}"),), "percentunit"),
        Panel("Prefix cache hit ratio", (Query(
            f"sum by (worker) (rate(sluice_worker_prefix_cache_hit_tokens_total[{RATE}])) / "
            f"sum by (worker) (rate(sluice_worker_prompt_tokens_total[{RATE}]))", "{{worker}}"),), "percentunit",
            "Prompt tokens found in the worker's prefix cache, of all prompt tokens it served"),
        Panel("Running and waiting requests", (
            Query("sum by (worker) (sluice_worker_requests_running)", "running {{worker}}"),
            Query("sum by (worker) (sluice_worker_requests_waiting)", "waiting {{worker}}"),
        )),
        Panel("Generated tokens per second", (Query(
            f"sum by (worker) (rate(sluice_worker_generated_tokens_total[{RATE}]))", "{{worker}}"),)),
        Panel("Engine step time", _quantiles("sluice_worker_step_duration_seconds", "phase"), "s",
              "Prefill steps (with prompt tokens) and decode steps"),
        Panel("KV events published", (Query(
            f"sum by (worker) (rate(sluice_worker_kv_events_published_total[{RATE}]))", "{{worker}}"),), "ops"),
    )),
    Row("Routing and queues", (
        Panel("Picks by worker and mode", (Query(
            f"sum by (worker, mode) (rate(sluice_router_picks_total[{RATE}]))", "{{worker}} ({{mode}})"),), "reqps",
            stacked=True),
        Panel("Decision latency", _quantiles("sluice_router_decision_seconds", "mode"), "s"),
        Panel("Cached share of the prompt on the chosen worker",
              (Query(f"sum(rate(sluice_router_overlap_ratio_sum[{RATE}])) / "
                     f"sum(rate(sluice_router_overlap_ratio_count[{RATE}]))", "mean"),), "percentunit"),
        Panel("Prefix index size", (Query("max by (model) (sluice_router_index_blocks)", "{{model}}"),), "short",
              "Blocks the prefix index lists for each model's live workers"),
        Panel("Queue depth", (
            Query("max by (model, pool) (sluice_pool_queue_messages)", "pool {{model}}/{{pool}}"),
            Query("max by (worker) (sluice_worker_queue_messages)", "worker {{worker}}"),
        ), "short", "Tasks waiting in Celery queues (read at scrape time)"),
        Panel("Live workers", (Query("max by (model) (sluice_live_workers)", "{{model}}"),)),
    )),
    Row("KV tiers", (
        Panel("Blocks held per tier", (Query("sum by (worker, tier) (sluice_worker_kv_tier_blocks)",
                                             "{{worker}} {{tier}}"),), "short",
              "Blocks each worker's host and disk tiers hold below its engine's cache (the shared tier's "
              "are in its Redis)"),
        Panel("Onboard hits per tier", (Query(
            f"sum by (tier) (rate(sluice_worker_kv_tier_hits_total[{RATE}]))", "{{tier}}"),), "short",
            "Blocks per second onboarded from a tier instead of recomputed", stacked=True),
        Panel("Tier traffic", (
            Query(f"sum by (tier) (rate(sluice_worker_kv_tier_offloaded_bytes_total[{RATE}]))", "offloaded {{tier}}"),
            Query(f"sum by (tier) (rate(sluice_worker_kv_tier_onboarded_bytes_total[{RATE}]))", "onboarded {{tier}}"),
        ), "Bps", "Bytes written to each tier, and read from it into the engines"),
        Panel("Onboard latency", _quantiles("sluice_worker_kv_tier_onboard_seconds", "tier"), "s",
              "Time of one onboard's reads from a tier"),
        Panel("Recomputes by reason", (
            Query(f"sum by (reason) (rate(sluice_worker_kv_tier_recomputes_total[{RATE}]))", "{{reason}}"),
            Query(f"sum(rate(sluice_worker_kv_tier_offloads_dropped_total[{RATE}]))", "offloads dropped"),
        ), "short", "Blocks per second a tier should have given and that were recomputed: corrupt (failed "
                    "its checksum), timeout (slower than SLUICE_KVBM__TIMEOUT_MS), down (the shared tier did "
                    "not answer); and blocks not offloaded because the offload queue was full"),
        Panel("What the tiers cost the engine", (
            Query(f"sum by (worker) (rate(sluice_worker_kv_tier_step_seconds_total[{RATE}]))", "in its steps {{worker}}"),
            Query(f"sum by (worker) (rate(sluice_worker_kv_tier_offload_cpu_seconds_total[{RATE}]))",
                  "offload CPU {{worker}}"),
        ), "percentunit", "Share of each worker's time its engine's steps spent in the KV tiers' connector (block "
                          "copies, onboard reads, planning), and the offload thread's CPU beside them"),
    )),
    Row("Planner", (
        Panel("Replicas per pool", (
            Query("max by (model, pool) (sluice_planner_desired_replicas)", "asked {{model}}/{{pool}}"),
            Query("max by (model, pool) (sluice_planner_actual_replicas)", "live {{model}}/{{pool}}"),
        ), "short", "What the acting planner asked each pool for, and the live workers it saw (sluice planner)"),
        Panel("Load observed and predicted", (
            Query('max by (model) (sluice_planner_observed_load{quantity="rate"})', "observed {{model}}"),
            Query('max by (model) (sluice_planner_predicted_load{quantity="rate"})', "predicted {{model}}"),
        ), "reqps", "Requests per second over the last interval, and the predictor's next interval"),
        Panel("Scaling actions", (Query(
            f"sum by (pool, direction) (increase(sluice_planner_actions_total[{RATE}]))", "{{pool}} {{direction}}"),),
            "short", "Pools grown and shrunk by the planner", stacked=True),
        Panel("Corrections", (Query("max by (model, phase) (sluice_planner_correction)", "{{model}} {{phase}}"),),
              "short", "sla mode: observed over expected TTFT (prefill) and ITL (decode); 1: the profile holds"),
    )),
)


def _panel_json(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    return {
        "id": panel_id, "type": "timeseries", "title": panel.title, "description": panel.description,
        "datasource": {"type": "prometheus", "uid": DATASOURCE_UID},
        "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": panel.unit, "custom": {
            "stacking": {"mode": "normal" if panel.stacked else "none", "group": "A"}}}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
        "targets": [{"refId": chr(ord("A") + i), "expr": q.expr, "legendFormat": q.legend,
                     "datasource": {"type": "prometheus", "uid": DATASOURCE_UID}} for i, q in enumerate(panel.queries)],
    }


def build_dashboard() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    y = 0
    for row in ROWS:
        panels.append({"id": len(panels) + 1, "type": "row", "title": row.title, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        y += 1
        for i, panel in enumerate(row.panels):
            panels.append(_panel_json(panel, len(panels) + 1, 12 * (i % 2), y + 8 * (i // 2)))
        y += 8 * ((len(row.panels) + 1) // 2)
    return {
        "uid": "sluice", "title": "Sluice", "tags": ["sluice"], "timezone": "browser", "editable": False,
        "schemaVersion": 39, "version": 1, "refresh": "10s", "time": {"from": "now-30m", "to": "now"},
        "templating": {"list": []}, "annotations": {"list": []}, "panels": panels,
    }


def expressions() -> list[str]:
    """Every PromQL expression of the dashboard, in panel order."""
    return [q.expr for row in ROWS for panel in row.panels for q in panel.queries]


def render() -> str:
    return json.dumps(build_dashboard(), indent=2) + "\n"
