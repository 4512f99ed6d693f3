"""One scrape of the frontend's metrics: the gauges read at scrape time are set (this process's open
and waiting requests, its limits, the live workers it knows of, and the queues and index read from
Redis), then the whole registry is rendered in Prometheus's text format."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from prometheus_client import generate_latest

from router.cluster import ClusterSnapshot

if TYPE_CHECKING:
    from app.runtime import FrontendRuntime

log = logging.getLogger(__name__)

#: How long a scrape waits for what it reads from Redis (queues, index) before answering without it.
CLUSTER_READ_TIMEOUT_S = 2.0


async def scrape(rt: FrontendRuntime) -> bytes:
    m = rt.metrics
    m.in_flight.set(rt.hub.in_flight())
    m.waiting.set(rt.admission.total_waiting())
    f = rt.settings.frontend
    m.limits.labels("max_waiting_per_worker").set(f.max_waiting_per_worker)
    m.limits.labels("max_queue_wait_seconds").set(f.max_queue_wait_s)
    for model, workers in rt.directory.served_models().items():
        m.live_workers.labels(model).set(len(workers))
    snapshot: ClusterSnapshot | None = None
    try:
        async with asyncio.timeout(CLUSTER_READ_TIMEOUT_S):
            snapshot = await rt.cluster.read()
    except Exception as exc:  # noqa: BLE001 - the frontend's own metrics are served without Redis
        log.warning("metrics: reading queues and index from Redis failed: %r", exc)
    m.observe_cluster(snapshot)
    return generate_latest(m.registry)
