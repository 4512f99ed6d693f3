"""The frontend's view of live workers and served models, refreshed in the background.

The request path never waits on Redis to learn who is alive: it reads the snapshot this keeps
(refreshed every ``router.registry_refresh_s``). Each refresh also ends the streams of requests
whose worker's lease has gone (it died or was killed); forgetting the gone worker (its queue, its
index entries, its registration) is the reaper's job (router.reaper). Model cards (tokenizer,
template) load off the event loop the first time a model appears.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from app.model_card import ModelCard
from app.requests.streams import StreamHub
from core.background import BackgroundTasks
from core.errors import ModelNotFound, NoWorkerAvailable
from core.loops import BackgroundLoop, Backoff
from router.registry import LiveWorker, Registry

log = logging.getLogger(__name__)


#: Called with each new snapshot (workers that take requests, by model) once it is in place.
RefreshHook = Callable[[dict[str, list[LiveWorker]]], Awaitable[None]]


class WorkerDirectory:
    def __init__(self, registry: Registry, hub: StreamHub, refresh_s: float, default_model: str,
                 on_refresh: RefreshHook | None = None, lost_grace_s: float = 3.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._registry = registry
        self._hub = hub
        self._on_refresh = on_refresh
        #: After Redis was away (a refresh failed, or none ran for ``_outage_s``), a lease that lapsed
        #: meanwhile says nothing of its worker, which could not renew it either (a restarted Redis holds
        #: no lease at all): streams on workers without a lease are failed only once ``lost_grace_s`` (a
        #: worker's lease) has passed since Redis answered again.
        self._outage_s = 2 * refresh_s + 1.0
        self._missed = False
        self._lost_grace_s = lost_grace_s
        #: Monotonic seconds (a test passes its own, so that no judgment depends on how busy the machine is).
        self._clock = clock
        self._judge_from = 0.0
        #: Workers that take requests (live, not draining), by model: what routing picks from.
        self.by_model: dict[str, list[LiveWorker]] = {}
        #: Every worker with a live lease, draining ones included (their streams go on).
        self.alive: set[str] = set()
        #: When the last refresh succeeded (monotonic): how current the snapshot is.
        self.refreshed_at = 0.0
        self._known_models: set[str] = {default_model}
        self._cards: dict[str, asyncio.Future[ModelCard]] = {}
        self._card_loads = BackgroundTasks("loading a model card")
        self._refresher = BackgroundLoop("worker-directory", self.refresh, interval_s=refresh_s,
                                         backoff=Backoff(first_s=refresh_s, max_s=1.0))

    async def start(self) -> None:
        """Take the first snapshot (its failure is the caller's), then refresh in the background; a failed
        refresh keeps the last snapshot and is retried after a pause that grows while Redis stays away."""
        await self.refresh()
        self._refresher.start()

    async def close(self) -> None:
        await self._refresher.stop()

    async def refresh(self) -> None:
        try:
            live = await self._registry.live_workers()
        except Exception:
            self._missed = True
            raise
        by_model: dict[str, list[LiveWorker]] = {}
        for w in live:
            if w.load.draining:
                continue
            by_model.setdefault(w.record.model, []).append(w)
            if w.record.model not in self._cards:
                self._load_card(w)
        self.by_model = by_model
        self._known_models.update(by_model)
        self.alive = alive = {w.record.worker_id for w in live}
        now = self._clock()
        if self._missed or (self.refreshed_at and now - self.refreshed_at > self._outage_s):
            self._judge_from = now + self._lost_grace_s
            self._missed = False
        self.refreshed_at = now
        if now >= self._judge_from:
            for stream in self._hub.streams_of_workers(self._hub.active_workers() - alive):
                stream.fail("worker_lost", f"worker {stream.worker_id} stopped responding (its lease expired)")
        if self._on_refresh is not None:
            await self._on_refresh(by_model)

    def _load_card(self, worker: LiveWorker) -> None:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._cards[worker.record.model] = fut

        async def load() -> None:
            try:
                card = await asyncio.to_thread(ModelCard.load, worker.record.model, Path(worker.record.model_path),
                                               int(worker.record.started_at),
                                               worker.record.context_length or None)
                fut.set_result(card)
            except Exception as exc:  # noqa: BLE001 - retried when the next worker registers
                log.exception("loading the tokenizer of %s from %s failed", worker.record.model, worker.record.model_path)
                fut.set_exception(exc)
                fut.exception()
                self._cards.pop(worker.record.model, None)

        self._card_loads.spawn(load())

    # ---- the request path -------------------------------------------------------------------
    def stale(self, limit_s: float) -> bool:
        """The snapshot is older than ``limit_s``: Redis has not answered a refresh since."""
        return self._clock() - self.refreshed_at > limit_s

    def workers_for(self, model: str, lora: str | None = None) -> list[LiveWorker]:
        """The workers that take requests for ``model`` (with the LoRA adapter ``lora`` loaded)."""
        workers = self.by_model.get(model)
        if workers and lora is not None:
            workers = [w for w in workers if w.load.has_lora(lora)]
            if not workers:
                raise NoWorkerAvailable(f"no worker has LoRA adapter {lora!r} loaded right now; retry shortly")
        if workers:
            return workers
        if model in self._known_models:
            raise NoWorkerAvailable(f"no worker is serving model {model!r} right now; retry shortly")
        raise ModelNotFound(f"the model {model!r} does not exist", param="model")

    def adapters(self) -> dict[str, str]:
        """Every LoRA adapter loaded on a live worker, and its base model."""
        return {name: model for model, workers in self.by_model.items()
                for w in workers for name in w.load.loras.split(",") if name}

    def resolve(self, name: str) -> tuple[str, str | None]:
        """A request's ``model``: a served model, ``(name, None)``, or a LoRA adapter, ``(its base
        model, name)``. An unknown name is left to :meth:`workers_for` to refuse."""
        if name in self.by_model:
            return name, None
        base = self.adapters().get(name)
        return (base, name) if base is not None else (name, None)

    async def card(self, model: str) -> ModelCard:
        self.workers_for(model)
        fut = self._cards.get(model)
        if fut is None:
            raise NoWorkerAvailable(f"model {model!r} is not loaded yet; retry shortly")
        return await asyncio.shield(fut)

    def served_models(self) -> dict[str, list[LiveWorker]]:
        return dict(self.by_model)

    def known_models(self) -> set[str]:
        return set(self._known_models)

    def loaded_card(self, model: str) -> ModelCard | None:
        fut = self._cards.get(model)
        if fut is not None and fut.done() and not fut.exception():
            return fut.result()
        return None
