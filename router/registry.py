"""Worker registry: registration under a lease, heartbeats, prefix-index slots, live listing.

Layout (see core.keys): ``worker:{id}`` hash and ``load:{id}`` hash, both with the lease TTL;
``workers`` sorted set of worker ids scored by lease expiry (unix seconds); ``slots`` hash
slot -> worker id; ``worker-queues`` hash worker id -> its own Celery queue and that queue's exchange,
kept after the lease. A worker that stops heartbeating drops out of :meth:`Registry.live_workers` as
soon as its lease expiry passes, whether or not anyone reaped it yet; a worker that deregisters ends
its lease at once. Forgetting a gone worker (its sorted-set entry, its slot, its queue) is the
reaper's job (router.reaper), which runs in any process and leaves alone a worker whose lease is live.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, fields

import redis.asyncio as aioredis

from core.keys import MAX_WORKER_SLOTS, Keys
from core.lua import lua_script


@dataclass(frozen=True, slots=True)
class WorkerIdentity:
    """Who a worker is and where its tasks go; known before its engine starts (``workers.signals``)."""

    worker_id: str
    model: str
    model_path: str
    pool: str
    queue: str
    pool_queue: str


@dataclass(frozen=True, slots=True)
class WorkerRecord(WorkerIdentity):
    """What a worker registers: its identity and its engine's facts; fixed for the worker's lifetime."""

    engine: str
    block_size: int
    kv_blocks: int
    max_num_seqs: int
    context_length: int
    started_at: float
    slot: int = -1
    #: Whether the engine reports its KV cache through events (False: routers guess, approximate mode).
    kv_events: bool = True
    #: Where the worker serves its Prometheus metrics ("": nowhere; workers.metrics).
    metrics_url: str = ""
    #: What the engine can do beyond plain generation, comma-separated (workers.engines.base.Feature).
    features: str = ""
    #: The most prompt tokens one engine step computes (a longer prefill takes several; 0: unknown).
    max_batched_tokens: int = 0

    def supports(self, feature: str) -> bool:
        return feature in self.features.split(",")


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    """A worker's live load: what its engine reports (``Engine.load()``, ``updated_at`` left 0) and what
    each heartbeat publishes, stamped with the heartbeat's wall-clock time."""

    running: int = 0
    waiting: int = 0
    active_blocks: int = 0
    total_blocks: int = 0
    updated_at: float = 0.0
    #: Shutting down: it finishes what it runs and takes nothing new (routers leave it out).
    draining: bool = False
    #: Times the worker rebuilt its prefix-index entries to repair them, since it started (workers.kv_relay).
    kv_resyncs: int = 0
    #: Tokens the engine generated per second over the last heartbeat interval.
    tokens_per_s: float = 0.0
    #: The LoRA adapters loaded, comma-separated (a request for one is routed only where it is loaded).
    loras: str = ""
    #: The worker's step-time model fitted from its own steps (workers.timing_model; "": none yet).
    timing: str = ""

    def has_lora(self, name: str) -> bool:
        return name in self.loras.split(",")

    @property
    def kv_usage(self) -> float:
        return self.active_blocks / self.total_blocks if self.total_blocks else 0.0


@dataclass(frozen=True, slots=True)
class WorkerQueue:
    """Where a worker's own tasks wait: its Celery queue and the exchange that queue is bound to.

    Celery binds every queue a worker consumes to the app's default exchange, which is named after the
    app's default queue: the worker's pool queue (workers.celery_app)."""

    queue: str
    exchange: str
    #: The worker's model: where its prefix-index keys live when they carry hash tags (core.keys).
    model: str = ""


@dataclass(frozen=True, slots=True)
class LiveWorker:
    record: WorkerRecord
    load: WorkerLoad
    lease_expires_at: float


def _decode_hash(raw: dict[bytes, bytes]) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in raw.items()}


def _parse_bool(raw: str) -> bool:
    return raw.strip().lower() in ("1", "true", "yes", "on")


_PARSERS = {"int": int, "float": float, "str": str, "bool": _parse_bool}


def _coerce(cls: type, data: dict[str, str]) -> object:
    """A dataclass from a Redis hash of strings; fields the hash lacks (an older writer) keep their defaults."""
    values = {}
    for f in fields(cls):
        if f.name in data:
            name = f.type.__name__ if isinstance(f.type, type) else str(f.type)
            values[f.name] = _PARSERS[name](data[f.name])
    return cls(**values)

class Registry:
    def __init__(self, client: aioredis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys
        self._claim = client.register_script(lua_script("router", "claim_slot.lua"))

    async def register(self, record: WorkerRecord, load: WorkerLoad, ttl_s: float) -> WorkerRecord:
        """Claim a slot and write the registration under a fresh lease; returns the record with its slot.

        The lease starts with the claim (one script), so a reaper never takes a worker that is
        registering again under its old name for dead (router/lua/reap.lua)."""
        now = time.time()
        slot = int(await self._claim(keys=[self.keys.slots, self.keys.workers],
                                     args=[record.worker_id, MAX_WORKER_SLOTS, now, now + ttl_s]))
        if slot < 0:
            raise RuntimeError(f"no free worker slot (at most {MAX_WORKER_SLOTS} workers per namespace)")
        record = WorkerRecord(**{**asdict(record), "slot": slot})
        await self._write(record, load, ttl_s)
        return record

    async def _write(self, record: WorkerRecord, load: WorkerLoad, ttl_s: float) -> None:
        ttl_ms = int(ttl_s * 1000)
        wkey, lkey = self.keys.worker(record.worker_id), self.keys.load(record.worker_id)
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hset(wkey, mapping={k: str(v) for k, v in asdict(record).items()})
            pipe.pexpire(wkey, ttl_ms)
            pipe.hset(lkey, mapping={k: str(v) for k, v in asdict(load).items()})
            pipe.pexpire(lkey, ttl_ms)
            pipe.zadd(self.keys.workers, {record.worker_id: time.time() + ttl_s})
            pipe.hset(self.keys.worker_queues, record.worker_id,
                      json.dumps(asdict(WorkerQueue(record.queue, record.pool_queue, record.model))))
            await pipe.execute()

    async def heartbeat(self, record: WorkerRecord, load: WorkerLoad, ttl_s: float) -> WorkerRecord | None:
        """Renew the lease and publish the load. When the registration is gone (the lease lapsed,
        or Redis restarted) register again and return the new record (its slot may differ)."""
        exists = await self.client.exists(self.keys.worker(record.worker_id))
        if not exists:
            return await self.register(record, load, ttl_s)
        ttl_ms = int(ttl_s * 1000)
        lkey = self.keys.load(record.worker_id)
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hset(lkey, mapping={k: str(v) for k, v in asdict(load).items()})
            pipe.pexpire(lkey, ttl_ms)
            pipe.pexpire(self.keys.worker(record.worker_id), ttl_ms)
            pipe.zadd(self.keys.workers, {record.worker_id: time.time() + ttl_s})
            await pipe.execute()
        return None

    async def deregister(self, worker_id: str) -> None:
        """End the worker's lease now (a clean shutdown): routers drop it at their next refresh, and the
        reaper forgets it (its slot, its queue and what is left in it, its index entries)."""
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.delete(self.keys.worker(worker_id), self.keys.load(worker_id))
            pipe.zadd(self.keys.workers, {worker_id: time.time()})
            await pipe.execute()

    async def live_workers(self, model: str | None = None) -> list[LiveWorker]:
        """Workers whose lease has not expired, in two round trips."""
        now = time.time()
        entries = await self.client.zrangebyscore(self.keys.workers, now, "+inf", withscores=True)
        if not entries:
            return []
        async with self.client.pipeline(transaction=False) as pipe:
            for wid, _ in entries:
                pipe.hgetall(self.keys.worker(wid.decode()))
                pipe.hgetall(self.keys.load(wid.decode()))
            raw = await pipe.execute()
        out: list[LiveWorker] = []
        for i, (_, expiry) in enumerate(entries):
            rec_raw, load_raw = raw[2 * i], raw[2 * i + 1]
            if not rec_raw:
                continue
            record = _coerce(WorkerRecord, _decode_hash(rec_raw))
            assert isinstance(record, WorkerRecord)
            if model is not None and record.model != model:
                continue
            load = _coerce(WorkerLoad, _decode_hash(load_raw)) if load_raw else WorkerLoad()
            assert isinstance(load, WorkerLoad)
            out.append(LiveWorker(record=record, load=load, lease_expires_at=float(expiry)))
        return out

    async def expired_workers(self) -> list[str]:
        """Workers whose lease ended (expired, or deregistered) and whom no reaper has forgotten yet."""
        now = time.time()
        return [w.decode() for w in await self.client.zrangebyscore(self.keys.workers, "-inf", now)]

    async def recorded_workers(self) -> list[str]:
        """Every worker whose queue is on record: live ones, and gone ones not reaped yet."""
        return [w.decode() for w in await self.client.hkeys(self.keys.worker_queues)]

    async def worker_queues(self) -> dict[str, WorkerQueue]:
        """Every queue record (live workers, and gone ones not reaped yet)."""
        raw = await self.client.hgetall(self.keys.worker_queues)
        return {w.decode(): WorkerQueue(**json.loads(q)) for w, q in raw.items()}

    async def worker_queue(self, worker_id: str) -> WorkerQueue | None:
        """The worker's own queue, as it registered it (None: no record, e.g. already reaped)."""
        raw = await self.client.hget(self.keys.worker_queues, worker_id)
        return WorkerQueue(**json.loads(raw)) if raw else None
