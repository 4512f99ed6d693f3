"""The standalone router service, for gateways and other frontends: ``sluice router``.

Listens on ``SLUICE_ROUTER__HOST`` / ``SLUICE_ROUTER__PORT`` (default 127.0.0.1:8001) and answers
with the KV-aware policy's choice without routing anything (nothing is recorded as in flight)::

    POST /best_worker  {"model": "smollm2", "token_ids": [1, 2, 3]}      (or "text": "..."; "pool": "prefill" for the prefill pool)
        -> {"worker_id": "...", "queue": "...", "overlap_blocks": 0, "cost": 3.0}
           with a prefill pool, the whole plan the frontend would make (router.request_plan):
           "disagg_reason": "long uncached prompt", "prefill": {"worker_id": ..., "queue": ..., ...}
    GET  /workers[?model=...]
        -> {"object": "list", "data": [{"worker_id": ..., "load": {...}, "index_blocks": ..., "metrics_url": ...}, ...]}
    POST /clear_kv_blocks  {"worker_id": "w1"}    (or {} for every worker)
        -> {"workers_notified": 1}

``text`` is tokenized with the ``tokenizer.json`` in the model directory a live worker registered
(special tokens added, as for a completions prompt). Errors have the OpenAI shape
``{"error": {"message", "type", "param", "code"}}``. The service also runs the reaper (router.reaper).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Self

from fastapi import FastAPI, Query, Request
from pydantic import BaseModel, Field, model_validator

from core.errors import InvalidRequest, NoWorkerAvailable
from core.http_errors import install_error_handlers
from core.redis_topology import RedisPlanes, RedisTopology
from core.settings import Settings, get_settings
from router.control import clear_kv_blocks
from router.disagg import split_pools
from router.kv_policy import KvPolicy
from router.policies import RouteDecision, RouteRequest, RouterOverrides
from router.reaper import run_reaper
from router.registry import LiveWorker, Registry
from router.request_plan import PlanRequest, disagg_mode, disagg_thresholds, plan_route
from router.worker_table import publishes_kv_events

if TYPE_CHECKING:
    from tokenizers import Tokenizer

TokenId = Annotated[int, Field(ge=0, lt=2**32)]


class BestWorkerRequest(BaseModel):
    model: str
    token_ids: list[TokenId] | None = None
    text: str | None = None
    lora: str | None = None
    overlap_score_weight: float | None = Field(None, ge=0)
    temperature: float | None = Field(None, ge=0)
    #: Which of the model's workers to pick from: ``serving``, those that answer requests (decode and
    #: aggregated workers, as the frontend routes), or ``prefill``, the prefill pool.
    pool: Literal["serving", "prefill"] = "serving"
    #: With ``pool`` ``serving``: whether a prefill worker computes the prompt, as for a request with
    #: ``x-sluice-router: disagg=...`` (None: the deployment's setting); and ``auto``'s thresholds.
    disagg: Literal["auto", "on", "off"] | None = None
    disagg_min_tokens: int | None = Field(None, ge=0)
    disagg_min_ratio: float | None = Field(None, ge=0, le=1)

    @model_validator(mode="after")
    def _one_prompt(self) -> BestWorkerRequest:
        if (self.token_ids is None) == (self.text is None):
            raise ValueError("give exactly one of token_ids and text")
        return self


class WorkerChoice(BaseModel):
    worker_id: str
    queue: str
    overlap_blocks: int
    cost: float

    @classmethod
    def of(cls, decision: RouteDecision, **more: Any) -> Self:
        """The choice ``decision`` made (``more``: a subclass's other fields)."""
        assert decision.worker_id is not None  # the kv policy always names one
        return cls(worker_id=decision.worker_id, queue=decision.queue, overlap_blocks=decision.overlap_blocks,
                   cost=decision.cost, **more)


class BestWorkerResponse(WorkerChoice):
    """The worker that would serve the request; where a prefill pool serves the model, why its prompt
    would or would not be computed there (``disagg_reason``) and the prefill worker that would (``prefill``).
    Fields that do not apply are left out."""

    disagg_reason: str | None = None
    prefill: WorkerChoice | None = None


class ClearKvRequest(BaseModel):
    worker_id: str | None = None


class ClearKvResponse(BaseModel):
    workers_notified: int


class WorkerLoadPublic(BaseModel):
    running: int
    waiting: int
    active_blocks: int
    total_blocks: int
    kv_usage: float


class WorkerPublic(BaseModel):
    worker_id: str
    model: str
    pool: str
    queue: str
    engine: str
    slot: int
    block_size: int
    kv_blocks: int
    kv_events: bool
    lease_expires_at: float
    load: WorkerLoadPublic
    index_blocks: int
    #: Where the worker serves its Prometheus metrics (None: it serves none).
    metrics_url: str | None = None


class WorkerList(BaseModel):
    object: str = "list"
    data: list[WorkerPublic]


@functools.lru_cache(maxsize=16)
def _tokenizer(path: str) -> Tokenizer:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(path)


def tokenize(model_path: str, text: str) -> list[int]:
    """Token ids of ``text`` with the model's ``tokenizer.json``; InvalidRequest when there is none."""
    path = Path(model_path) / "tokenizer.json"
    if not path.is_file():
        raise InvalidRequest(f"no tokenizer at {path}: send token_ids instead of text", param="text")
    return list(_tokenizer(str(path)).encode(text).ids)


class RouterService:
    """What the endpoints use: the registry (cached for ``registry_refresh_s``) and the KV policy on the
    routing state's Redis, and the broker's Redis, where the workers listen for control commands."""

    def __init__(self, settings: Settings, planes: RedisPlanes) -> None:
        self.settings = settings
        self.planes = planes
        self.keys = planes.topology.keys
        self.registry = Registry(planes.index, self.keys)
        self.policy = KvPolicy(planes.index, self.keys, settings.router)
        self._cache: tuple[float, list[LiveWorker]] = (0.0, [])

    async def workers(self, model: str | None = None) -> list[LiveWorker]:
        stamp, cached = self._cache
        if time.monotonic() - stamp > self.settings.router.registry_refresh_s:
            cached = await self.registry.live_workers()
            self._cache = (time.monotonic(), cached)
        now = time.time()
        return [w for w in cached if w.lease_expires_at >= now and (model is None or w.record.model == model)]

    async def best_worker(self, body: BestWorkerRequest) -> BestWorkerResponse:
        serving, prefill = split_pools(await self.workers(body.model))
        workers = prefill if body.pool == "prefill" else serving
        if not workers:
            which = "prefill worker" if body.pool == "prefill" else "decode or aggregated worker"
            raise NoWorkerAvailable(f"no live {which} serves model {body.model!r}", param="model")
        token_ids = body.token_ids if body.token_ids is not None else tokenize(workers[0].record.model_path,
                                                                               body.text or "")
        overrides = RouterOverrides(overlap_score_weight=body.overlap_score_weight, temperature=body.temperature,
                                    disagg_min_tokens=body.disagg_min_tokens, disagg_min_ratio=body.disagg_min_ratio)
        route = RouteRequest(request_id=f"best-{uuid.uuid4().hex}", model=body.model, token_ids=token_ids,
                             lora=body.lora, overrides=overrides)
        if body.pool == "prefill":
            return BestWorkerResponse.of(await self.policy.best(route, workers))
        plan = await plan_route(PlanRequest(route, serving, prefill,
                                            disagg=disagg_mode(body.disagg, self.settings.disagg.enabled),
                                            thresholds=disagg_thresholds(self.settings.disagg, overrides)),
                                self.policy.best)
        return BestWorkerResponse.of(plan.serving,
                                     disagg_reason=plan.disagg.reason if plan.disagg is not None else None,
                                     prefill=WorkerChoice.of(plan.prefill) if plan.prefill is not None else None)

    async def list_workers(self, model: str | None) -> WorkerList:
        workers = await self.workers(model)
        sizes: dict[str, int] = {}
        for model in {w.record.model for w in workers}:  # per model: its own shard on a cluster
            sizes.update(await self.policy.index.sizes([w.record.worker_id for w in workers
                                                        if w.record.model == model], model))
        return WorkerList(data=[
            WorkerPublic(
                worker_id=w.record.worker_id, model=w.record.model, pool=w.record.pool, queue=w.record.queue,
                engine=w.record.engine, slot=w.record.slot, block_size=w.record.block_size,
                kv_blocks=w.record.kv_blocks, kv_events=publishes_kv_events(w.record),
                lease_expires_at=w.lease_expires_at, index_blocks=sizes[w.record.worker_id],
                metrics_url=w.record.metrics_url or None,
                load=WorkerLoadPublic(running=w.load.running, waiting=w.load.waiting,
                                      active_blocks=w.load.active_blocks, total_blocks=w.load.total_blocks,
                                      kv_usage=w.load.kv_usage))
            for w in sorted(workers, key=lambda w: w.record.worker_id)])


def create_app(settings: Settings | None = None, *, reaper: bool = True) -> FastAPI:
    settings = settings or get_settings()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        topology = RedisTopology.from_settings(settings.redis)
        planes = RedisPlanes.open(topology, "background")
        service = RouterService(settings, planes)
        app.state.service = service
        task = (asyncio.get_running_loop().create_task(
            run_reaper(service.registry, service.policy.index, settings.router.reaper_interval_s,
                       broker=planes.broker), name="reaper")
            if reaper else None)
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await service.policy.aclose()
            await planes.aclose()

    app = FastAPI(title="Sluice router", lifespan=lifespan)

    install_error_handlers(app)

    @app.post("/best_worker", response_model=BestWorkerResponse, response_model_exclude_none=True)
    async def best_worker(body: BestWorkerRequest, request: Request) -> BestWorkerResponse:
        service: RouterService = request.app.state.service
        return await service.best_worker(body)

    @app.get("/workers", response_model=WorkerList)
    async def workers(request: Request, model: str | None = Query(None)) -> WorkerList:
        service: RouterService = request.app.state.service
        return await service.list_workers(model)

    @app.post("/clear_kv_blocks", response_model=ClearKvResponse)
    async def clear_kv(body: ClearKvRequest, request: Request) -> ClearKvResponse:
        service: RouterService = request.app.state.service
        return ClearKvResponse(workers_notified=await clear_kv_blocks(service.planes.broker, service.keys,
                                                                     body.worker_id))

    return app


def run(settings: Settings | None = None) -> None:
    """Serve the router on ``settings.router.host:port`` until interrupted (``sluice router``)."""
    import uvicorn

    settings = settings or get_settings()
    from core.logs import configure_logging

    configure_logging(settings.log_format, "info")
    uvicorn.run(create_app(settings), host=settings.router.host, port=settings.router.port, log_level="info",
                log_config=None)
