"""``/metrics`` (Prometheus) and ``/prometheus/targets`` (Prometheus discovery: every live Sluice
process's metrics endpoint, in the ``http_sd_configs`` format; router.discovery)."""

from __future__ import annotations

import asyncio
import logging

from fastapi import APIRouter
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import JSONResponse, PlainTextResponse, Response

from app.api.deps import RuntimeDep
from app.api.openapi import METRICS_RESPONSES
from router.cluster import ClusterSnapshot
from router.discovery import read_targets

log = logging.getLogger(__name__)

router = APIRouter()

#: How long a scrape waits for what it reads from Redis (queues, index) before answering without it.
CLUSTER_READ_TIMEOUT_S = 2.0


@router.get("/metrics", response_class=PlainTextResponse, responses=METRICS_RESPONSES)
async def metrics(rt: RuntimeDep) -> Response:
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
        snapshot = await asyncio.wait_for(rt.cluster.read(), CLUSTER_READ_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - the frontend's own metrics are served without Redis
        log.warning("metrics: reading queues and index from Redis failed: %r", exc)
    m.observe_cluster(snapshot)
    return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/prometheus/targets")
async def prometheus_targets(rt: RuntimeDep) -> Response:
    return JSONResponse(await read_targets(rt.registry, rt.frontends))
