"""A fleet of simulated workers in one process: N mocker engines on one event loop, each with its own
registration, lease, heartbeat, queue name and KV relay, against one Redis.

What is real: the mocker engine (scheduler, paged KV cache, prefix cache, eviction, KV events),
``Registry.register``/``heartbeat`` (the slot claim, the lease and its renewal, re-registration when
a lease is lost), the KV relay (``workers.kv_relay.KvRelay``: numbered batches applied by the index's
Lua script, go-live resync, the ``kv-events`` stream) and the purge and deregistration at the end.
What is not: no Celery consumer listens on a worker's queue (its name is registered, the list exists
only once something is pushed), no control channel, no metrics endpoint; the engines run with
``no_sleep`` (steps take no time), and requests go straight to an engine, not through a router: the
stream's only job is to fill the caches, and with them the index, through the real ingest path.

Usage (one process; several processes with disjoint ``first`` reach larger counts)::

    fleet = Fleet(client, Keys("ns"), FleetSpec(workers=250, first=0))
    await fleet.start()            # register every worker, publish its (empty) cache, start heartbeats
    stats = await fleet.drive()    # the request stream; returns the ingest figures
    await fleet.stop()             # purge, deregister, stop the engines
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace

import redis.asyncio as aioredis

from bench.fleet.workload import FleetWorkload, group_of, group_prefix, worker_prompt
from core.keys import Keys
from core.messages import BlockRemoved, BlockStored, SamplingParams
from core.pools import Pool
from core.settings import MockerSettings
from router.registry import Registry, WorkerLoad, WorkerRecord
from workers.engines.base import EngineKvEvent, EngineRequest
from workers.engines.mocker.engine import MockerEngine
from workers.kv_relay import KvRelay
from workers.metrics import WorkerMetrics

MODEL = "sim-model"
#: The longest one worker's purge or engine shutdown may take at ``stop``.
LEAVE_TIMEOUT_S = 20.0


@dataclass(frozen=True, slots=True)
class FleetSpec:
    """Workers ``first`` .. ``first + workers - 1`` (ids ``sim-00000``...), each a mocker with
    ``kv_blocks`` blocks of ``block_size`` tokens, heartbeating every ``heartbeat_s`` under a lease of
    ``lease_ttl_s`` (the worker defaults, core.settings.WorkerSettings)."""

    workers: int
    first: int = 0
    model: str = MODEL
    kv_blocks: int = 512
    block_size: int = 16
    heartbeat_s: float = 1.0
    lease_ttl_s: float = 3.0
    #: Requests each worker runs at once during ``drive``.
    concurrency: int = 2
    #: Workers running their requests at once during ``drive``: the engines' steps (``no_sleep``) share
    #: one event loop with every worker's heartbeat, and hundreds of busy engines on it would delay the
    #: heartbeats past the lease (a simulator's artefact: real workers each have their own process).
    driving: int = 4
    workload: FleetWorkload = field(default_factory=FleetWorkload)


def worker_id(index: int) -> str:
    return f"sim-{index:05d}"


@dataclass(frozen=True, slots=True)
class StartStats:
    workers: int
    seconds: float
    registrations_per_s: float


@dataclass(frozen=True, slots=True)
class IngestStats:
    """What ``drive`` pushed into the index: batches applied (one ``apply`` call each), the events and
    blocks in them, over the wall time from the first request to the last batch applied."""

    workers: int
    requests: int
    started_at: float
    ended_at: float
    batches: int
    events: int
    blocks_stored: int
    blocks_removed: int
    cached_tokens: int
    prompt_tokens: int

    @property
    def seconds(self) -> float:
        return self.ended_at - self.started_at


@dataclass(frozen=True, slots=True)
class LeaseStats:
    """Heartbeats sent, how many failed, how many found the lease gone and registered again, and the
    slowest renewal (ms)."""

    heartbeats: int
    failures: int
    reregistrations: int
    max_ms: float


@dataclass
class SimWorker:
    index: int
    engine: MockerEngine
    relay: KvRelay
    record: WorkerRecord
    stored: int = 0
    removed: int = 0
    events: int = 0

    def on_kv_events(self, events: Sequence[EngineKvEvent]) -> None:
        for event in events:
            if isinstance(event, BlockStored):
                self.stored += len(event.block_hashes)
            elif isinstance(event, BlockRemoved):
                self.removed += len(event.block_hashes)
        self.events += len(events)
        self.relay.push(events)


class Fleet:
    def __init__(self, client: aioredis.Redis, keys: Keys, spec: FleetSpec) -> None:
        self.client, self.keys, self.spec = client, keys, spec
        self.registry = Registry(client, keys)
        #: One metrics object for the whole fleet: a registry per simulated worker would cost memory, not realism.
        self.metrics = WorkerMetrics()
        self.workers: list[SimWorker] = []
        self._heartbeats: list[asyncio.Task[None]] = []
        self._heartbeat_ms: list[float] = []
        self._failures = 0
        self._reregistrations = 0

    def _mocker(self) -> MockerSettings:
        s = self.spec
        return MockerSettings(no_sleep=True, kv_blocks=s.kv_blocks, block_size=s.block_size, max_num_seqs=64)

    def _record(self, index: int, engine: MockerEngine) -> WorkerRecord:
        wid, info = worker_id(index), engine.info
        return WorkerRecord(
            worker_id=wid, model=self.spec.model, model_path="", pool=Pool.AGG, queue=self.keys.worker_queue(wid),
            pool_queue=self.keys.pool_queue(self.spec.model, "agg"), engine=info.engine, block_size=info.block_size,
            kv_blocks=info.kv_blocks, max_num_seqs=info.max_num_seqs, context_length=info.context_length,
            started_at=time.time())

    def _load(self, worker: SimWorker) -> WorkerLoad:
        return replace(worker.engine.load(), updated_at=time.time())

    async def start(self) -> StartStats:
        """Start every engine, register it under a lease, publish its cache (go-live), then heartbeat."""
        t0 = time.perf_counter()
        settings = self._mocker()
        for index in range(self.spec.first, self.spec.first + self.spec.workers):
            engine = MockerEngine(self.spec.model, settings, context_length=settings.kv_blocks * settings.block_size)
            relay = KvRelay(self.client, self.keys, worker_id(index), self.spec.model, self.metrics)
            worker = SimWorker(index, engine, relay, record=None)  # type: ignore[arg-type]  # registered below
            await engine.start(worker.on_kv_events)
            worker.record = self._record(index, engine)
            self.workers.append(worker)

        loop = asyncio.get_running_loop()
        rng = random.Random(self.spec.first)

        async def go_live(worker: SimWorker) -> None:
            worker.record = await self.registry.register(worker.record, self._load(worker), self.spec.lease_ttl_s)
            # Heartbeats start with the lease, each at its own phase of the interval.
            self._heartbeats.append(loop.create_task(self._heartbeat(worker, rng.random() * self.spec.heartbeat_s)))
            await worker.relay.start(worker.record.slot, worker.engine.cached_block_hashes)

        await _bounded(32, [go_live(w) for w in self.workers])
        elapsed = time.perf_counter() - t0
        return StartStats(len(self.workers), elapsed, len(self.workers) / elapsed)

    async def _heartbeat(self, worker: SimWorker, offset_s: float) -> None:
        """The worker host's heartbeat (workers.host.EngineHost._heartbeat), spread over the interval."""
        await asyncio.sleep(offset_s)
        while True:
            await asyncio.sleep(self.spec.heartbeat_s)
            t0 = time.perf_counter()
            try:
                fresh = await self.registry.heartbeat(worker.record, self._load(worker), self.spec.lease_ttl_s)
            except Exception:  # noqa: BLE001 - counted; the next heartbeat tries again, as a worker's does
                self._failures += 1
                continue
            self._heartbeat_ms.append((time.perf_counter() - t0) * 1000)
            if fresh is not None:  # the lease lapsed: registered again, the index must be rebuilt
                self._reregistrations += 1
                worker.record = fresh
                await worker.relay.start(fresh.slot, worker.engine.cached_block_hashes)

    def lease_stats(self) -> LeaseStats:
        return LeaseStats(len(self._heartbeat_ms) + self._failures, self._failures, self._reregistrations,
                          max(self._heartbeat_ms, default=0.0))

    async def drive(self) -> IngestStats:
        """Run the request stream (module bench.fleet.workload) on every worker at once; returns once
        every KV event it caused is in the index."""
        wl = self.spec.workload
        prefixes = {g: group_prefix(wl, g) for g in {group_of(wl, w.index) for w in self.workers}}
        sampling = SamplingParams(max_tokens=wl.output_tokens, temperature=0.0, ignore_eos=True)
        batches0 = sum(w.relay.event_id for w in self.workers)
        before = [(w.stored, w.removed, w.events) for w in self.workers]
        cached = prompt = 0

        async def serve(worker: SimWorker, k: int) -> None:
            nonlocal cached, prompt
            tokens = worker_prompt(wl, worker.index, k, prefixes[group_of(wl, worker.index)])
            request = EngineRequest(f"{worker.record.worker_id}-r{k}", tokens, sampling)
            async for out in worker.engine.generate(request):
                if out.usage is not None:
                    cached += out.usage.cached_tokens
                    prompt += out.usage.prompt_tokens

        async def run(worker: SimWorker) -> None:
            for k in range(0, wl.requests_per_worker, self.spec.concurrency):
                await asyncio.gather(*(serve(worker, j) for j in range(k, min(k + self.spec.concurrency,
                                                                                wl.requests_per_worker))))
            await worker.relay.drained()

        started = time.time()
        await _bounded(self.spec.driving, [run(w) for w in self.workers])
        ended = time.time()
        return IngestStats(
            workers=len(self.workers), requests=len(self.workers) * wl.requests_per_worker, started_at=started,
            ended_at=ended, batches=sum(w.relay.event_id for w in self.workers) - batches0,
            events=sum(w.events - b[2] for w, b in zip(self.workers, before, strict=True)),
            blocks_stored=sum(w.stored - b[0] for w, b in zip(self.workers, before, strict=True)),
            blocks_removed=sum(w.removed - b[1] for w, b in zip(self.workers, before, strict=True)),
            cached_tokens=cached, prompt_tokens=prompt)

    async def stop(self) -> None:
        """Stop heartbeating, purge every worker's index entries, end its lease, stop its engine."""
        for task in self._heartbeats:
            task.cancel()
        for task in self._heartbeats:
            with contextlib.suppress(asyncio.CancelledError):
                await task

        async def leave(worker: SimWorker) -> None:
            async with asyncio.timeout(LEAVE_TIMEOUT_S):
                await worker.relay.close()
            await self.registry.deregister(worker.record.worker_id)
            async with asyncio.timeout(LEAVE_TIMEOUT_S):
                await worker.engine.shutdown()

        await _bounded(32, [leave(w) for w in self.workers])


async def _bounded(limit: int, coros: list) -> list:
    """Run coroutines with at most ``limit`` at once (bounds the connections a burst opens)."""
    gate = asyncio.Semaphore(limit)

    async def one(coro):
        async with gate:
            return await coro

    return await asyncio.gather(*(one(c) for c in coros))


def as_dict(stats: object) -> dict:
    """A stats dataclass as JSON-ready builtins (with its derived ``seconds`` where it has one)."""
    out = asdict(stats)  # type: ignore[call-overload]  # any dataclass instance
    if hasattr(stats, "seconds"):
        out["seconds"] = stats.seconds
    return out
