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

import asyncio
import functools
import json
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, TypeVar, cast

from core.keys import MAX_WORKER_SLOTS, Keys
from core.lua import lua_script
from core.pools import Pool
from core.redis_topology import IndexClient
from core.redis_values import text
from router.cluster_channel import ClusterChannel, routing_channel
from router.resp import pack_command
from router.resp_channel import RespChannel

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class WorkerIdentity:
    """Who a worker is and where its tasks go; known before its engine starts (``workers.signals``)."""

    worker_id: str
    model: str
    model_path: str
    pool: Pool
    queue: str
    pool_queue: str

    def __post_init__(self) -> None:
        if not isinstance(self.pool, Pool):  # built from a name ("agg"): the type, so callers may ask it
            object.__setattr__(self, "pool", Pool(self.pool))


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
    #: KV blocks holding cached content (in use or evictable): what is left of ``total_blocks`` is free.
    cached_blocks: int = 0
    #: What a block in each KV tier is worth against a device block, ``host=0.7,disk=0.2`` (workers.kvbm.credit).
    tier_credit: str = ""
    #: Blocks each of the worker's own KV tiers holds, ``host=120,disk=3000`` (``sluice status``).
    tier_blocks: str = ""

    def has_lora(self, name: str) -> bool:
        return name in self.loras.split(",")

    @property
    def kv_usage(self) -> float:
        return self.active_blocks / self.total_blocks if self.total_blocks else 0.0


_V = TypeVar("_V")

#: The KV tiers a worker's load may credit, in the order of the candidate table's TIER column.
KV_TIERS = ("host", "disk", "shared")


def parse_pairs(text: str, kind: Callable[[str], _V]) -> dict[str, _V]:
    """``host=120,disk=3000`` as a dict, each value read by ``kind`` (the load record's tier fields); a pair
    ``kind`` refuses is left out."""
    out: dict[str, _V] = {}
    for pair in filter(None, text.split(",")):
        name, _, value = pair.partition("=")
        try:
            out[name] = kind(value)
        except ValueError:
            continue
    return out


@functools.lru_cache(maxsize=1024)
def parse_tier_credit(text: str) -> dict[str, float]:
    """``host=0.7,disk=0.2`` as a dict of the known tiers' credits, each clamped to [0, 1]; a malformed or
    unknown entry is left out (credited 0)."""
    return {name: min(1.0, max(0.0, credit)) for name, credit in parse_pairs(text, float).items()
            if name in KV_TIERS and credit == credit}  # not NaN


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


#: ``live_workers`` parses this many workers, then lets the event loop run: a frontend's listing of
#: thousands of workers must not hold up the requests it routes meanwhile. A reply that arrives during
#: a chunk can wait for two (the next was queued first): about 0.25 ms each on the 2-core VM.
LISTING_CHUNK = 50


def _parse_bool(raw: str) -> bool:
    return raw.strip().lower() in ("1", "true", "yes", "on")


def _parse_pool(raw: str) -> Pool:
    return Pool(raw)  # type: ignore[call-arg]  # a lookup by value (EnumMeta.__call__), not the members' __new__


_PARSERS: dict[str, Callable[[str], object]] = {"int": int, "float": float, "str": str, "bool": _parse_bool,
                                                "Pool": _parse_pool}


@functools.cache
def _field_parsers(cls: type) -> dict[bytes, tuple[str, Callable[[str], object]]]:
    """Per field of a dataclass, keyed by its name as Redis returns it: the name and its parser."""
    out: dict[bytes, tuple[str, Callable[[str], object]]] = {}
    for f in fields(cls):
        name = f.type.__name__ if isinstance(f.type, type) else str(f.type)
        out[f.name.encode()] = (f.name, _PARSERS[name])
    return out


def _pairs(reply: Sequence[bytes] | dict[bytes, bytes]) -> Iterable[tuple[bytes, bytes]]:
    """An ``HGETALL`` reply's (field, value) pairs: a flat list in RESP2, a map in RESP3."""
    if isinstance(reply, dict):
        return reply.items()
    return zip(reply[0::2], reply[1::2], strict=True)


def _coerce(cls: type, reply: Sequence[bytes] | dict[bytes, bytes]) -> object:
    """A dataclass from an ``HGETALL`` reply; fields the hash lacks (an older writer) keep their defaults,
    fields the class lacks (a newer writer) are ignored."""
    parsers = _field_parsers(cls)
    values = {}
    for name, raw in _pairs(reply):
        known = parsers.get(name)
        if known is not None:
            values[known[0]] = known[1](raw.decode())
    return cls(**values)


#: A load's fields in the order ``live_workers`` reads them (``HMGET``), and how each is parsed from
#: the bytes Redis holds (``int`` and ``float`` take bytes as they are).
_LOAD_FIELDS = tuple(f.name for f in fields(WorkerLoad))
_BYTES_PARSERS: dict[str, Callable[[bytes], object]] = {
    "int": int, "float": float, "str": bytes.decode, "bool": lambda raw: _parse_bool(raw.decode())}
_LOAD_PARSERS = tuple(_BYTES_PARSERS[f.type.__name__ if isinstance(f.type, type) else str(f.type)]
                      for f in fields(WorkerLoad))


def _load(values: Sequence[bytes | None]) -> WorkerLoad:
    """A load from ``HMGET load`` of :data:`_LOAD_FIELDS`; fields the hash lacks (an older writer, or no
    hash at all) keep their defaults."""
    if None not in values:
        every: list[Any] = [parse(raw) for parse, raw in zip(_LOAD_PARSERS, values, strict=True) if raw is not None]
        return WorkerLoad(*every)
    present: dict[str, Any] = {name: parse(raw) for name, parse, raw in zip(_LOAD_FIELDS, _LOAD_PARSERS, values, strict=True)
                               if raw is not None}
    return WorkerLoad(**present)


@functools.lru_cache(maxsize=65536)
def _listing_reads(keys: Keys, wid: bytes, known: bool) -> bytes:
    """What ``live_workers`` reads of one worker, packed: its load, and its registration whole (a worker
    not seen before) or only the fields that tell whether it changed (``_marker``)."""
    name = wid.decode()
    load = pack_command("HMGET", keys.load(name), *_LOAD_FIELDS)
    if known:
        return load + pack_command("HMGET", keys.worker(name), "slot", "started_at")
    return load + pack_command("HGETALL", keys.worker(name))


def _marker(reply: Sequence[bytes] | dict[bytes, bytes]) -> list[bytes | None]:
    """A registration's slot and start time, as ``HMGET worker slot started_at`` returns them."""
    values = dict(_pairs(reply))
    return [values.get(b"slot"), values.get(b"started_at")]

class Registry:
    def __init__(self, client: IndexClient, keys: Keys, *,
                 channel: RespChannel | ClusterChannel | None = None) -> None:
        self.client = client
        self.keys = keys
        self._claim = client.register_script(lua_script("router", "claim_slot.lua"))
        #: The registry's own connection for the listing's hand-packed reads.
        self.channel = channel or routing_channel(client)  # a cluster's: the registry's keys share one slot
        #: The registrations the last ``live_workers`` saw, by worker id: their slot and start time as
        #: Redis holds them, and the parsed record.
        self._records: dict[bytes, tuple[list[bytes | None], WorkerRecord]] = {}
        #: Workers whose registration this release cannot read (warned about once each).
        self._unreadable: set[bytes] = set()

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

    async def aclose(self) -> None:
        """Close the registry's own connection (its client is the caller's to close)."""
        await self.channel.aclose()

    async def deregister(self, worker_id: str) -> None:
        """End the worker's lease now (a clean shutdown): routers drop it at their next refresh, and the
        reaper forgets it (its slot, its queue and what is left in it, its index entries)."""
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.delete(self.keys.worker(worker_id), self.keys.load(worker_id))
            pipe.zadd(self.keys.workers, {worker_id: time.time()})
            await pipe.execute()

    async def live_workers(self, model: str | None = None) -> list[LiveWorker]:
        """Workers whose lease has not expired, by worker id, in two round trips (three when a registration
        changed). The order is the ids' and not the leases' (every heartbeat moves its worker in those),
        so the lists of two calls line up while the workers stay (router.worker_table keeps its columns).

        A registration is fixed for the worker's lifetime, except its slot when it registers again, and
        a new process under the same id starts with a new ``started_at``: a worker seen at the previous
        call is checked by those two fields (``HMGET``) and its parsed record reused; only the load is
        read and parsed whole every time, its fields in a fixed order (``HMGET``, :data:`_LOAD_FIELDS`)
        so that no field name is matched. The reads (the lease listing too) go out hand-packed on the
        registry's own connection (router.resp_channel) and hiredis parses the replies: at a thousand
        workers a redis-py pipeline of two ``HGETALL`` per worker cost the client about 50 ms per call
        (the frontend refreshes four times a second), ``HGETALL`` of the loads over this connection
        about 10 ms of client CPU, the fixed-order read about 7."""
        (leases,) = await self.channel.call(
            pack_command("ZRANGEBYSCORE", self.keys.workers, repr(time.time()), "+inf", "WITHSCORES"), 1)
        if not leases:
            self._records = {}
            return []
        if isinstance(leases[0], list):  # RESP3 (a client whose pool the channel goes through): pairs
            leases = [x for pair in leases for x in pair]
        known = self._records  # this call's view, whatever a concurrent call does to the cache
        entries = sorted(zip(leases[0::2], leases[1::2], strict=True))
        ids: list[bytes] = [wid for wid, _ in entries]
        packed = b"".join(_listing_reads(self.keys, wid, wid in known) for wid in ids)
        replies = await self.channel.call(packed, 2 * len(ids))
        changed = [wid for i, wid in enumerate(ids) if wid in known and replies[2 * i + 1] != known[wid][0]]
        full: dict[bytes, list[bytes]] = {}
        if changed:  # registered again (another slot), or a new process under the same id, or gone
            fresh = await self.channel.call(
                b"".join(pack_command("HGETALL", self.keys.worker(w.decode())) for w in changed), len(changed))
            full = dict(zip(changed, fresh, strict=True))
        out: list[LiveWorker] = []
        seen: dict[bytes, tuple[list[bytes | None], WorkerRecord]] = {}
        for i, (wid, expiry) in enumerate(entries):
            if i and i % LISTING_CHUNK == 0:
                await asyncio.sleep(0)  # let the requests waiting on this loop go between chunks
            load_raw, rec_raw = replies[2 * i], replies[2 * i + 1]
            cached = known.get(wid)
            if cached is not None and wid not in full:
                marker, record = cached
            else:
                rec_raw = full.get(wid, rec_raw)
                if not rec_raw:  # deregistered or expired between the two reads
                    continue
                try:
                    record = cast(WorkerRecord, _coerce(WorkerRecord, rec_raw))
                except ValueError as exc:  # a newer worker's (a pool this release does not know): not routed to
                    if wid not in self._unreadable:
                        self._unreadable.add(wid)
                        log.warning("worker %s: its registration is unreadable here (%s); not routed to", wid.decode(), exc)
                    continue
                marker = _marker(rec_raw)
            seen[wid] = (marker, record)
            if model is not None and record.model != model:
                continue
            out.append(LiveWorker(record=record, load=_load(load_raw), lease_expires_at=float(expiry)))
        self._records = seen
        return out

    async def expired_workers(self) -> list[str]:
        """Workers whose lease ended (expired, or deregistered) and whom no reaper has forgotten yet."""
        now = time.time()
        expired = await self.client.zrangebyscore(self.keys.workers, "-inf", now)  # no scores: names only
        return [text(cast(bytes, w)) for w in expired]

    async def recorded_workers(self) -> list[str]:
        """Every worker whose queue is on record: live ones, and gone ones not reaped yet."""
        return [text(w) for w in await self.client.hkeys(self.keys.worker_queues)]

    async def worker_queues(self) -> dict[str, WorkerQueue]:
        """Every queue record (live workers, and gone ones not reaped yet)."""
        raw = await self.client.hgetall(self.keys.worker_queues)
        return {text(w): WorkerQueue(**json.loads(q)) for w, q in raw.items()}

    async def worker_queue(self, worker_id: str) -> WorkerQueue | None:
        """The worker's own queue, as it registered it (None: no record, e.g. already reaped)."""
        raw = await self.client.hget(self.keys.worker_queues, worker_id)
        return WorkerQueue(**json.loads(raw)) if raw else None
