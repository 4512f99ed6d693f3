"""``/metrics`` (Prometheus) and ``/prometheus/targets`` (Prometheus discovery: every live Sluice
process's metrics endpoint, in the ``http_sd_configs`` format; router.discovery)."""

from __future__ import annotations

from fastapi import APIRouter
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.responses import JSONResponse, PlainTextResponse, Response

from app.api.deps import RuntimeDep
from app.api.openapi import METRICS_RESPONSES
from app.metrics_scrape import scrape
from router.discovery import read_targets

router = APIRouter()


@router.get("/metrics", response_class=PlainTextResponse, responses=METRICS_RESPONSES)
async def metrics(rt: RuntimeDep) -> Response:
    return Response(await scrape(rt), media_type=CONTENT_TYPE_LATEST)


@router.get("/prometheus/targets")
async def prometheus_targets(rt: RuntimeDep) -> Response:
    return JSONResponse(await read_targets(rt.registry, rt.frontends))
