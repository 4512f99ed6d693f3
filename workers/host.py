"""The engine host: one engine per worker process, on its own event loop thread.

Celery task threads hand requests over with :meth:`EngineHost.serve` and block until the
request has finished, so Celery's view (active tasks, prefetch, Flower) matches the engine's.
The loop thread owns everything asynchronous: the engine, the Redis client, the delta
publisher, the heartbeat (lease + load), the control-channel listener (cancel, clear KV) and the
KV relay that keeps the Redis prefix index equal to the engine's prefix cache (workers.kv_relay).
The host also owns the worker's Prometheus metrics and their ``/metrics`` endpoint (workers.metrics),
whose URL it registers.

An engine whose ``publishes_kv_events`` is False (``workers.engines.base.Engine``) registers with
``kv_events=False``: routers then guess its cache from their own decisions (approximate mode), and
the host only purges those guesses (on ``clear_kv`` and at shutdown).

Requests run in workers.request_runner (its invariant: one last delta per request, whatever happens;
disaggregation's hand-off); what runs is shared state (workers.running) the control channel and the
lifecycle here read too.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace

from core.keys import Keys
from core.messages import ErrorInfo
from core.redis_topology import RedisPlanes, RedisTopology
from core.settings import Settings
from core.task_requests import (
    UnreadableRequest,
    read_request,
)
from router.registry import Registry, WorkerIdentity, WorkerLoad, WorkerRecord
from workers.control import ControlChannel
from workers.engines.base import Engine, EngineKvEvent, StepStats
from workers.kv_relay import KvRelay
from workers.kvbm.credit import measured_credit, tier_blocks
from workers.metrics import MetricsEndpoint, TokenRate, WorkerMetrics
from workers.publisher import DeltaPublisher
from workers.request_runner import RequestRunner
from workers.running import RunningRequests
from workers.timing_model import TimingFit

log = logging.getLogger(__name__)

@dataclass
class EngineHost:
    settings: Settings
    engine: Engine
    identity: WorkerIdentity
    keys: Keys = field(init=False)
    record: WorkerRecord | None = field(default=None, init=False)
    metrics: WorkerMetrics = field(default_factory=WorkerMetrics, init=False)

    def __post_init__(self) -> None:
        self.keys = RedisTopology.from_settings(self.settings.redis).keys
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="engine-loop", daemon=True)
        self.running = RunningRequests()
        #: Since when (monotonic) each running request's frontend's lease has been seen missing.
        self._frontend_missing: dict[str, float] = {}
        self._background: list[asyncio.Task[None]] = []
        self._stopping = False
        self._control: ControlChannel | None = None
        self._metrics_endpoint: MetricsEndpoint | None = None
        self._token_rate = TokenRate()
        #: The worker's own step-time model, fitted from its steps and published with its load.
        self.timing = TimingFit()
        self.metrics.watch_tiers(self.engine.tier_report)

    # ---- lifecycle (called from the Celery main thread) -------------------------------------
    def serve_metrics(self) -> str:
        """Start the worker's ``/metrics`` endpoint (unless the settings turn it off); returns its URL,
        registered at go-live ("" without one). Raises OSError when its address cannot be bound."""
        self._metrics_endpoint = MetricsEndpoint.start(self.metrics.registry, self.settings.worker)
        return self.metrics_url

    @property
    def metrics_url(self) -> str:
        return self._metrics_endpoint.url if self._metrics_endpoint is not None else ""

    def start(self) -> None:
        """Start the loop thread and the engine; raises EngineStartError if the engine cannot start."""
        self._thread.start()
        self._call(self._start())

    def go_live(self) -> None:
        """Register under a lease and start heartbeating: from now on routers may pick this worker."""
        self._call(self._go_live())

    def drain(self) -> None:
        """Stop taking requests (called in Celery's signal handler: schedules, does not wait)."""
        asyncio.run_coroutine_threadsafe(self._drain(), self._loop)

    def stop(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        with contextlib.suppress(Exception):
            self._call(self._stop(), timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if self._metrics_endpoint is not None:
            self._metrics_endpoint.close()

    def serve(self, payload: dict) -> None:
        """Run one request to its end (called from a Celery task thread; blocks). A message this worker
        cannot read is answered with an error event (where it names its reply channel), not guessed at."""
        try:
            request = read_request(payload)
        except UnreadableRequest as exc:
            self._call(self.runner.refuse(exc))
            return
        self._call(self.runner.serve(request), timeout=None)

    def _call(self, coro, timeout: float | None = 600):
        fut: concurrent.futures.Future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return fut.result(timeout)

    # ---- on the loop ------------------------------------------------------------------------
    async def _start(self) -> None:
        # The broker's Redis carries token deltas, control commands and frontend leases; the registry and
        # the prefix index go to the routing state's Redis (the same one unless they are apart).
        self.planes = RedisPlanes.open(RedisTopology.from_settings(self.settings.redis), "background")
        self.redis = self.planes.broker
        self.publisher = DeltaPublisher(self.redis, self.keys)
        self.publisher.start()
        self.registry = Registry(self.planes.index, self.keys)
        self.kv = KvRelay(self.planes.index, self.keys, self.identity.worker_id, self.identity.model, self.metrics)
        self.runner = RequestRunner(self.engine, self.identity, self.keys, self.publisher, self.metrics, self.running)
        self.engine.on_step = self._on_step
        await self.engine.start(self._on_kv_events)

    def _on_step(self, step: StepStats) -> None:
        self.metrics.observe_step(step)
        self.timing.observe(step)

    def _on_kv_events(self, events: Sequence[EngineKvEvent]) -> None:
        if self.kv_events:
            self.kv.push(events)

    @property
    def kv_events(self) -> bool:
        """Whether the engine reports its cache (False: the routers' approximate mode)."""
        return self.engine.publishes_kv_events

    async def _publish_kv_state(self, slot: int) -> None:
        """Make the index hold the engine's whole cache at ``slot`` (go-live, re-registration)."""
        if self.kv_events:
            await self.kv.start(slot, self.engine.cached_block_hashes, self.engine.tier_block_hashes)

    def _make_record(self) -> WorkerRecord:
        info = self.engine.info
        return WorkerRecord(
            **asdict(self.identity), engine=info.engine, block_size=info.block_size, kv_blocks=info.kv_blocks,
            max_num_seqs=info.max_num_seqs, context_length=info.context_length, started_at=time.time(),
            max_batched_tokens=info.max_batched_tokens,
            kv_events=self.kv_events, metrics_url=self.metrics_url,
            features=",".join(sorted(info.features)),
        )

    def _load(self) -> WorkerLoad:
        """The load record a heartbeat publishes (the worker's gauges are set from it too)."""
        load = replace(self.engine.load(), updated_at=time.time(), draining=self.running.draining,
                       kv_resyncs=self.metrics.kv_index_resyncs_total(),
                       tokens_per_s=self._token_rate.sample(self.metrics.generated_tokens_total(), time.monotonic()),
                       loras=",".join(self.engine.loras()), cached_blocks=self.engine.cached_block_count())
        self.timing.set_usage(load.kv_usage)
        model = self.timing.model()
        if model is not None:
            load = replace(load, timing=model.encode())
        tiers = self.engine.tier_report()
        if tiers is not None:
            load = replace(load, tier_blocks=tier_blocks(tiers),
                           tier_credit=load.tier_credit or measured_credit(tiers, model, self.engine.info.block_size))
        self.metrics.observe_load(load)
        return load

    async def _drain(self) -> None:
        """Say ``draining`` in the load record now, not at the next heartbeat; at the drain deadline,
        hand what still runs back to the frontends."""
        if self.running.draining:
            return
        self.running.draining = True
        timeout = self.settings.worker.drain_timeout_s
        log.info("worker %s draining: %d running request(s) have %.0f s to finish; taking no new one",
                 self.identity.worker_id, len(self.running.tasks), timeout)
        asyncio.get_running_loop().call_later(timeout, lambda: asyncio.ensure_future(self._evict_running()))
        await self._publish_load_now()

    async def _evict_running(self) -> None:
        """The drain deadline: every request still running ends with ``worker_draining`` (after the
        tokens it has), and its frontend continues it on another worker."""
        if self.running.tasks:
            log.warning("worker %s drain deadline: moving %d running request(s) to other workers",
                        self.identity.worker_id, len(self.running.tasks))
        await self._end_on_our_own(self.running.ids(), ErrorInfo(
            "worker_draining", f"worker {self.identity.worker_id} is shutting down; the request continues elsewhere"))

    async def _go_live(self) -> None:
        self.record = await self.registry.register(self._make_record(), self._load(), self.settings.worker.lease_ttl_s)
        await self._publish_kv_state(self.record.slot)
        self._control = ControlChannel(self.redis, self.keys, self.identity, self.engine, self.running,
                                       drain=self._drain, publish_load=self._publish_load_now,
                                       forget_guesses=self._forget_guesses)
        self._control.start()
        loop = asyncio.get_running_loop()
        self._background = [loop.create_task(self._heartbeat(), name="heartbeat")]
        log.info("worker %s live on queues %s, %s (slot %d)", self.identity.worker_id,
                 self.identity.queue, self.identity.pool_queue, self.record.slot)

    async def _heartbeat(self) -> None:
        interval = self.settings.worker.heartbeat_interval_s
        renewed_at = time.monotonic()  # the last renewal that Redis took (when its answer came)
        sent_at = renewed_at  # when that renewal was sent: Redis took it at or after this
        failed_at: float | None = None  # the last failed renewal since then
        while True:
            await asyncio.sleep(interval)
            try:
                assert self.record is not None
                began = time.monotonic()
                fresh = await self.registry.heartbeat(self.record, self._load(), self.settings.worker.lease_ttl_s)
                if fresh is not None:  # re-registered (Redis lost our lease): the index must be rebuilt
                    log.warning("worker %s registered again: its lease lapsed (the last renewal Redis took was "
                                "%.1f s ago, the lease is %.1f s; a stalled process or machine, or Redis restarted)",
                                self.identity.worker_id, began - renewed_at, self.settings.worker.lease_ttl_s)
                    self.record = fresh
                    await self._drop_lapsed(sent_at if failed_at is None else failed_at)
                    await self._publish_kv_state(fresh.slot)
                # On time and answered at once: a stall of this process, of Redis or of the whole machine
                # (a busy one stops processes for seconds) held the frontends' renewals up too.
                steady = (failed_at is None and fresh is None and began - renewed_at <= 2 * interval
                          and time.monotonic() - began <= interval)
                renewed_at, sent_at, failed_at = time.monotonic(), began, None
                await self._drop_orphans(steady)
            except Exception:  # noqa: BLE001 - keep heartbeating through Redis hiccups
                failed_at = time.monotonic()
                log.exception("heartbeat failed")

    async def _drop_lapsed(self, lapsed_at: float) -> None:
        """Abort the requests that started before the lease was lost (``lapsed_at``: the last renewal
        that failed, or else when the last that Redis took was sent): their frontends took this worker for
        lost, or lost their streams with Redis, and moved or ended them. A request taken since (Redis came
        back before this renewal) has a frontend waiting for it and goes on. A request that started while
        that renewal was on its way counts as taken since: Redis may have lost the lease before it came (on a
        busy machine the answer is read late, after requests taken since the loss). Dropping a request its
        frontend waits for fails a client; keeping one its frontend moved costs compute (nobody reads that
        attempt's id)."""
        stale = self.running.started_before(lapsed_at)
        if stale:
            log.warning("worker %s dropping %d of %d running request(s): this worker's lease lapsed, and their "
                        "frontends moved or ended them", self.identity.worker_id, len(stale), len(self.running.tasks))
        await self._end_on_our_own(stale, ErrorInfo(
            "worker_lost", f"worker {self.identity.worker_id} lost its lease and stopped the request"))

    async def _drop_orphans(self, steady: bool) -> None:
        """Abort the requests of frontends whose lease has been missing for ``frontend_grace_s``
        (the frontend died: nobody reads their tokens). One pipelined call for all of them. The grace
        counts from a ``steady`` heartbeat on: after a stall (this process's, Redis's, the machine's)
        a frontend that is alive gets its time to renew its lease before its requests are judged."""
        frontends = sorted(set(self.running.frontend_of.values()))
        if not frontends or not steady:
            self._frontend_missing.clear()
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for frontend_id in frontends:
                pipe.exists(self.keys.frontend_lease(frontend_id))
            present = await pipe.execute()
        now, grace = time.monotonic(), self.settings.worker.frontend_grace_s
        missing = {f: self._frontend_missing.get(f, now) for f, there in zip(frontends, present, strict=True)
                   if not there}
        self._frontend_missing = missing
        gone = {f for f, since in missing.items() if now - since >= grace}
        if not gone:
            return
        orphans = [r for r, f in self.running.frontend_of.items() if f in gone]
        log.warning("worker %s dropping %d request(s) of gone frontend(s) %s", self.identity.worker_id,
                    len(orphans), ", ".join(sorted(gone)))
        await self._end_on_our_own(orphans, ErrorInfo(
            "worker_lost", f"worker {self.identity.worker_id} took the request's frontend for gone (its lease lapsed) "
                           "and stopped the request"))

    async def _end_on_our_own(self, request_ids: Sequence[str], error: ErrorInfo) -> None:
        """Abort requests this worker ends on its own; each ends with ``error`` (workers/request_runner.py)."""
        for request_id in request_ids:
            self.running.stopped[request_id] = error
            await self.engine.abort(request_id)

    async def _publish_load_now(self) -> None:
        """Publish the load record now, not at the next heartbeat (a LoRA adapter loaded, a drain)."""
        if self.record is not None:
            with contextlib.suppress(Exception):
                await self.registry.heartbeat(self.record, self._load(), self.settings.worker.lease_ttl_s)

    async def _forget_guesses(self) -> None:
        """Drop the routers' guesses of this worker's cache (an engine without KV events)."""
        if not self.kv_events:
            await self.kv.index.purge(self.identity.worker_id, self.identity.model)

    async def _stop(self) -> None:
        for task in self._background:
            task.cancel()
        if self._control is not None:
            await self._control.stop()
        for request_id in self.running.ids():
            with contextlib.suppress(Exception):
                await self.engine.abort(request_id)
        with contextlib.suppress(Exception):
            await self.engine.shutdown()
        with contextlib.suppress(Exception):
            await self.kv.close()
        with contextlib.suppress(Exception):
            await self.registry.deregister(self.identity.worker_id)
        await self.publisher.close()
        with contextlib.suppress(Exception):
            await self.planes.aclose()
