"""``/health`` (the process is up) and ``/ready`` (every served model has a live worker)."""

from __future__ import annotations

from collections import Counter

from fastapi import APIRouter
from starlette.responses import JSONResponse, Response

from app.api.deps import RuntimeDep
from app.api.openapi import READY_RESPONSES

router = APIRouter()


@router.get("/health")
async def health() -> Response:
    return JSONResponse({"status": "ok"})


#: The worker snapshot is refreshed every 250 ms; older than this, Redis is not answering.
STALE_SNAPSHOT_S = 2.0


@router.get("/ready", responses=READY_RESPONSES)
async def ready(rt: RuntimeDep) -> Response:
    if rt.drain.draining:
        return JSONResponse({"ready": False, "reason": "the frontend is shutting down"}, status_code=503,
                            headers={"Retry-After": "1"})
    if rt.directory.stale(STALE_SNAPSHOT_S):
        return JSONResponse({"ready": False, "reason": "the request plane (Redis) is unreachable"}, status_code=503,
                            headers={"Retry-After": "2"})
    served = rt.directory.served_models()
    known = sorted(rt.directory.known_models())
    models = {m: len(served.get(m, [])) for m in known}
    pools = {m: dict(Counter(w.record.pool for w in served.get(m, []))) for m in known}
    # A model is served once a worker can generate for it: prefill workers alone cannot.
    is_ready = bool(models) and all(sum(n for p, n in pools[m].items() if p.serves_clients) > 0 for m in known)
    return JSONResponse({"ready": is_ready, "models": models, "pools": pools}, status_code=200 if is_ready else 503,
                        headers=None if is_ready else {"Retry-After": "2"})
