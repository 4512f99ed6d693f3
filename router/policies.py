"""Routing policies: pick the worker (and so the Celery queue) for a request.

Every policy implements :class:`Policy`. The frontend keeps one instance per mode for the life of
the process (round robin holds a counter; app.runtime builds them); the live worker list comes from
the registry cache. ``kv`` (KV-aware, prefix index in Redis) is router.kv_policy.KvPolicy, which
implements the same protocol.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from core.wire import TaskParts
from router.registry import LiveWorker


@dataclass(frozen=True, slots=True)
class RouterOverrides:
    """Per-request routing parameters (``x-sluice-router`` header or the ``sluice`` extension)."""

    mode: str | None = None
    #: The ``kv`` mode's cost: ``time`` or ``blocks`` (core.settings.RouterSettings.cost).
    cost: str | None = None
    overlap_score_weight: float | None = None
    temperature: float | None = None
    worker_id: str | None = None
    #: Disaggregated prefill: "auto" (the thresholds decide), "on" (remote whenever a prefill worker
    #: is live), "off" (always local); and the thresholds of "auto" (router.disagg).
    disagg: str | None = None
    disagg_min_tokens: float | None = None
    disagg_min_ratio: float | None = None
    #: Moves allowed when the serving worker is lost (app.requests.generation), capped by the deployment's.
    max_migrations: float | None = None


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """``task``: the message to enqueue on the chosen queue; a policy that can route and enqueue in
    one step does so (and says ``enqueued`` in its decision), otherwise the caller enqueues it."""

    request_id: str
    model: str
    token_ids: Sequence[int]
    lora: str | None = None
    overrides: RouterOverrides = field(default_factory=RouterOverrides)
    task: TaskParts | None = None


@dataclass(frozen=True, slots=True)
class RouteDecision:
    worker_id: str | None
    queue: str
    overlap_blocks: int = 0
    cost: float = 0.0
    enqueued: bool = False


class Policy(Protocol):
    async def choose(self, request: RouteRequest, workers: Sequence[LiveWorker]) -> RouteDecision: ...

    def release(self, request_id: str) -> None:
        """The request finished (done, failed or cancelled): forget anything the policy predicted for it."""

    def prefill_done(self, request_id: str) -> None:
        """The request's first token is out: its prompt is computed."""


def _decision(worker: LiveWorker) -> RouteDecision:
    return RouteDecision(worker_id=worker.record.worker_id, queue=worker.record.queue)


class RoundRobinPolicy:
    def __init__(self) -> None:
        self._counter = itertools.count()

    async def choose(self, request: RouteRequest, workers: Sequence[LiveWorker]) -> RouteDecision:
        ordered = sorted(workers, key=lambda w: w.record.worker_id)
        return _decision(ordered[next(self._counter) % len(ordered)])

    def release(self, request_id: str) -> None:
        pass

    def prefill_done(self, request_id: str) -> None:
        pass


class RandomPolicy:
    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()

    async def choose(self, request: RouteRequest, workers: Sequence[LiveWorker]) -> RouteDecision:
        return _decision(self._rng.choice(list(workers)))

    def release(self, request_id: str) -> None:
        pass

    def prefill_done(self, request_id: str) -> None:
        pass


class LeastLoadedPolicy:
    """Fewest requests: the larger of the worker's heartbeat load (running + waiting) and this
    frontend's own requests still in flight on it. Each undercounts in its own way (the heartbeat is
    up to one interval old and misses what was just sent; the own count misses other frontends'
    requests), so the larger is taken, not the sum, which would count a request twice once a
    heartbeat includes it. Ties are broken at random."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()
        self._inflight: dict[str, str] = {}
        self._per_worker: dict[str, int] = {}

    def score(self, worker: LiveWorker) -> float:
        own = self._per_worker.get(worker.record.worker_id, 0)
        return max(worker.load.running + worker.load.waiting, own)

    async def choose(self, request: RouteRequest, workers: Sequence[LiveWorker]) -> RouteDecision:
        scores = [self.score(w) for w in workers]
        best = min(scores)
        chosen = self._rng.choice([w for w, s in zip(workers, scores, strict=True) if s == best])
        wid = chosen.record.worker_id
        self._inflight[request.request_id] = wid
        self._per_worker[wid] = self._per_worker.get(wid, 0) + 1
        return RouteDecision(worker_id=wid, queue=chosen.record.queue, cost=best)

    def release(self, request_id: str) -> None:
        wid = self._inflight.pop(request_id, None)
        if wid is not None:
            left = self._per_worker.get(wid, 1) - 1
            if left > 0:
                self._per_worker[wid] = left
            else:
                self._per_worker.pop(wid, None)

    def prefill_done(self, request_id: str) -> None:
        pass


class PoolPolicy:
    """No choice at all: the pool's shared queue, first free worker takes it (Celery's own balancing)."""

    async def choose(self, request: RouteRequest, workers: Sequence[LiveWorker]) -> RouteDecision:
        return RouteDecision(worker_id=None, queue=workers[0].record.pool_queue)

    def release(self, request_id: str) -> None:
        pass

    def prefill_done(self, request_id: str) -> None:
        pass
