"""``/health`` (the process is up), ``/ready`` (every served model has a live worker), ``/metrics``."""

from __future__ import annotations

from fastapi import APIRouter
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import JSONResponse, Response

from app.api.deps import RuntimeDep

router = APIRouter()


@router.get("/health")
async def health() -> Response:
    return JSONResponse({"status": "ok"})


@router.get("/ready")
async def ready(rt: RuntimeDep) -> Response:
    served = rt.directory.served_models()
    models = {m: len(served.get(m, [])) for m in sorted(rt.directory.known_models())}
    is_ready = bool(models) and all(n > 0 for n in models.values())
    return JSONResponse({"ready": is_ready, "models": models}, status_code=200 if is_ready else 503)


@router.get("/metrics")
async def metrics(rt: RuntimeDep) -> Response:
    rt.metrics.in_flight.set(rt.hub.in_flight())
    for model, workers in rt.directory.served_models().items():
        rt.metrics.live_workers.labels(model).set(len(workers))
    return Response(generate_latest(rt.metrics.registry), media_type=CONTENT_TYPE_LATEST)
