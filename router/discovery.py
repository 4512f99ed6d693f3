"""Prometheus service discovery: every live Sluice process's metrics endpoint, as target groups.

The format is the one Prometheus reads from ``http_sd_configs`` (the frontend's
``GET /prometheus/targets``) and ``file_sd_configs`` (``sluice prometheus-targets``)::

    [{"targets": ["127.0.0.1:41235"],
      "labels": {"__metrics_path__": "/metrics", "sluice_namespace": "default", "component": "worker",
                 "worker": "w1", "model": "smollm2", "pool": "agg", "engine": "mocker"}},
     {"targets": ["127.0.0.1:8000"],
      "labels": {"__metrics_path__": "/metrics", "sluice_namespace": "default", "component": "frontend",
                 "frontend": "3f2a9c01d2e4"}}]

The acting planner (``sluice planner``), when one serves metrics, has a group with ``component: planner``.
One group per process, so each carries its own labels (which Prometheus adds to every series it
scrapes there). Workers without a metrics endpoint (``SLUICE_WORKER__METRICS_PORT=-1``) are left out.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from router.frontends import FrontendRegistry, LiveFrontend
from router.registry import LiveWorker, Registry

TargetGroup = dict[str, Any]


def target_group(metrics_url: str, labels: dict[str, str]) -> TargetGroup | None:
    """One process's group: ``host:port`` of ``metrics_url`` and its path as ``__metrics_path__``;
    None when the URL names no host."""
    url = urlsplit(metrics_url)
    if not url.netloc:
        return None
    extra = {"__scheme__": url.scheme} if url.scheme not in ("", "http") else {}
    return {"targets": [url.netloc], "labels": {"__metrics_path__": url.path or "/metrics", **extra, **labels}}


def planner_metrics_url(lease: bytes | str | None) -> str:
    """The acting planner's metrics URL from its lease's value (planner.leader: JSON with ``metrics_url``);
    "" when no planner acts or it serves no metrics."""
    if lease is None:
        return ""
    try:
        value = json.loads(lease)
    except ValueError:
        return ""
    return str(value.get("metrics_url") or "") if isinstance(value, dict) else ""


def prometheus_targets(namespace: str, workers: Iterable[LiveWorker],
                       frontends: Iterable[LiveFrontend], planner_url: str = "") -> list[TargetGroup]:
    """The target groups of the live frontends, then the live workers, each sorted by id, then the acting
    planner's (``planner_url``: its metrics endpoint, "" for none)."""
    groups: list[TargetGroup | None] = []
    for f in sorted(frontends, key=lambda f: f.record.frontend_id):
        groups.append(target_group(f.record.metrics_url, {
            "sluice_namespace": namespace, "component": "frontend", "frontend": f.record.frontend_id}))
    for w in sorted(workers, key=lambda w: w.record.worker_id):
        r = w.record
        groups.append(target_group(r.metrics_url, {
            "sluice_namespace": namespace, "component": "worker", "worker": r.worker_id, "model": r.model,
            "pool": r.pool, "engine": r.engine}))
    if planner_url:
        groups.append(target_group(planner_url, {"sluice_namespace": namespace, "component": "planner"}))
    return [g for g in groups if g is not None]


async def read_targets(registry: Registry, frontends: FrontendRegistry) -> list[TargetGroup]:
    """The target groups of every live process of the registries' namespace, the acting planner's included
    (its lease is on the frontends' Redis; two round trips, concurrently)."""
    workers, live, lease = await asyncio.gather(registry.live_workers(), frontends.live(),
                                                frontends.client.get(frontends.keys.planner_leader))
    return prometheus_targets(registry.keys.namespace, workers, live, planner_metrics_url(lease))
