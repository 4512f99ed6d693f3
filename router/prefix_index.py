"""The Redis prefix index: which worker holds which KV block, one bitmap per block.

Layout (core.keys): ``{model}:kv:{hash}`` is a bitmap with bit ``slot`` set while the worker at that
slot holds the block (the key disappears with its last bit); ``kvw:{worker}`` (set) and
``kva:{worker}`` (sorted set by expiry, approximate mode) list what each worker holds so it can be
purged; ``kvm:{worker}`` records the worker's last applied event id, slot and model, and outlives
the lease so a reaper can purge a worker whose registration already expired; ``kv-slots`` says whose
bits each slot holds and ``kv-slot-tags`` repeats it as 32-bit tags, cheap to read.

Invariants:

* A worker's bits change only through its own event batches (:meth:`PrefixIndex.apply`, atomic per
  batch, in event id order), its resyncs, or a purge. A batch whose id does not follow the last
  applied one is refused as a gap and the worker resyncs (:meth:`PrefixIndex.resync`).
* Slots are recycled by the registry when a lease ends. A slot's bits are written only by the worker
  the index records as its owner; a new holder of the slot first purges the previous owner, so the
  bitmaps never credit a worker with a dead predecessor's blocks (readers also check the owner).
* Each worker's blocks form prefix-closed chains: a worker that holds a block holds its parent. The
  index does not enforce this, it inherits it from the engines, all of which keep their prefix
  caches so: a block is computed only while its request holds the whole prefix, and a cached block
  becomes evictable only when no request holds it, the chain's tail first (vLLM frees a request's
  blocks in reverse order and evicts least recently freed first, SGLang's radix cache evicts leaves,
  the mocker does as vLLM); a block whose parent is gone could never be reused anyway. Approximate
  guesses keep it too (a chain is written whole and expires from its tail). So along a prompt's
  chain a worker's bit, once cleared, stays cleared, which lets the deciding script search for
  where each run ends instead of reading every block (``index_scripts.DECIDE``). Were an engine to
  break it, a worker could be credited with blocks past a hole that falls between two probes; the
  full read below stays exact.
* Scoring a prompt against every worker is one Redis round trip (:meth:`PrefixIndex.read`), whatever
  the number of workers: an ``MGET`` of the prompt's block bitmaps (per block size) and a
  ``GETRANGE`` of the slot tags (and of the in-flight sums), pipelined; numpy finds each worker's
  leading run (router.scoring). The routers' own decisions search instead (router.inflight).

Usage on a worker host (one task per worker calls these in order)::

    index = PrefixIndex(redis_client, keys)
    await index.resync(worker_id, slot, model, engine.cached_block_hashes(), event_id=0)
    result = await index.apply(batch, slot=slot, model=model)
    if result.needs_resync:
        await index.resync(worker_id, slot, model, engine.cached_block_hashes(), batch.event_id)
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import xxhash

from core.keys import KV_EVENTS_STREAM_MAXLEN, Keys
from core.messages import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent, KvEventBatch, encode_kv_batch
from core.redis_topology import IndexClient
from core.redis_values import ScriptArg, text
from router import index_scripts
from router.cluster_channel import ClusterChannel, routing_channel
from router.resp import hex_digits, pack_command, pack_mget
from router.resp_channel import RespChannel
from router.scoring import leading_overlaps

#: How long the index credits a block reported in a model's shared KV tier (workers.kvbm), by default.
SHARED_TIER_TTL_S = 600.0
#: Blocks cleared per purge call: bounds how long one call holds Redis.
PURGE_CHUNK_BLOCKS = 20_000
#: Blocks written per resync call; a larger state is written in several calls (not atomically).
RESYNC_CHUNK_BLOCKS = 100_000
#: Expired approximate guesses dropped per worker per sweep (the rest go on the next sweeps).
APPROX_EXPIRE_PER_SWEEP = 10_000

ApplyStatus = Literal["ok", "dup", "gap", "busy"]


@functools.lru_cache(maxsize=65536)
def owner_tag(worker_id: str) -> int:
    """The 32-bit tag of a worker in ``kv-slot-tags`` (never 0, which means no owner)."""
    return xxhash.xxh32_intdigest(worker_id.encode()) or 1


@functools.lru_cache(maxsize=4096)
def _getrange(key: str, length: int) -> bytes:
    """``GETRANGE key 0 length-1``, packed."""
    return pack_command("GETRANGE", key, 0, length - 1)


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """What :meth:`PrefixIndex.apply` did. ``status``: ``ok`` applied; ``dup`` the batch was applied
    before (ignored); ``gap`` batches are missing (or the index lost the worker, e.g. Redis restarted,
    or the worker's slot changed); ``busy`` the slot still holds another worker's bits. On ``gap`` and
    ``busy`` nothing was applied and the worker must resync."""

    status: ApplyStatus
    last_event_id: int
    blocks_stored: int = 0
    blocks_removed: int = 0

    @property
    def needs_resync(self) -> bool:
        return self.status in ("gap", "busy")


@dataclass(frozen=True, slots=True)
class IndexRead:
    """One scoring read. ``overlaps[c][j]``: leading blocks of chain ``c`` held at ``slots[j]``;
    ``tags[j]``: the owner tag of ``slots[j]`` (0: no owner); ``decode[j]``/``prefill[j]``: the
    in-flight sums of ``slots[j]`` (zeros unless asked for)."""

    slots: np.ndarray
    overlaps: list[np.ndarray]
    tags: np.ndarray
    decode: np.ndarray
    prefill: np.ndarray


#: A KV tier's letter in the index's keys (docs/routing.md, "KV tiers"); the device has none.
TIER_LETTERS = {"host": b"h", "disk": b"d"}
#: APPLY's operations per event kind and tier: stored, removed.
_OPS: dict[str, tuple[bytes, bytes]] = {"device": (b"S", b"R"), "host": (b"Th", b"Uh"), "disk": (b"Td", b"Ud"),
                                        "shared": (b"G", b"g")}


def _ops(batch: KvEventBatch) -> list[bytes]:
    ops: list[bytes] = []
    for event in batch.events:
        if isinstance(event, BlockStored | BlockRemoved):
            if event.block_hashes:
                ops.append(_OPS[event.tier][isinstance(event, BlockRemoved)] + hex_digits(event.block_hashes))
        elif isinstance(event, AllBlocksCleared):
            ops.append(b"C")
    return ops


def _uint32_at(blob: bytes, offsets: np.ndarray) -> np.ndarray:
    """The big-endian uint32 numbers ``offsets`` of a blob; 0 past its end (Redis reads missing as 0)."""
    values = np.frombuffer(blob[: len(blob) // 4 * 4], dtype=">u4")
    out = np.zeros(offsets.size, dtype=np.int64)
    inside = offsets < values.size
    out[inside] = values[offsets[inside]]
    return out


class PrefixIndex:
    def __init__(self, client: IndexClient, keys: Keys, *, stream_maxlen: int = KV_EVENTS_STREAM_MAXLEN,
                 channel: RespChannel | ClusterChannel | None = None, shared_ttl_s: float = SHARED_TIER_TTL_S) -> None:
        """``shared_ttl_s``: how long a block reported in the model's shared KV tier is credited to every
        worker after the report (the tier evicts on its own, unseen; a stale credit costs one recompute)."""
        self.client = client
        self.shared_ttl_ms = int(shared_ttl_s * 1000)
        self.keys = keys
        #: The connection the scoring read goes out on (router.resp_channel, router.cluster_channel).
        self.channel = channel or routing_channel(client)
        self.stream_maxlen = stream_maxlen
        self._apply = client.register_script(index_scripts.APPLY)
        self._resync = client.register_script(index_scripts.RESYNC)
        self._purge = client.register_script(index_scripts.PURGE)
        self._expire = client.register_script(index_scripts.EXPIRE_GUESSES)

    def _worker_keys(self, worker_id: str, model: str | None) -> list[str]:
        """The keys every index script of one worker takes; ``model`` (the worker's) is needed only with
        hash tags (core.keys), where they all live in its model's slot."""
        k = self.keys
        owners = k.kv_slot_owners_of(model) if model is not None else k.kv_slot_owners
        tags = k.kv_slot_tags_of(model) if model is not None else k.kv_slot_tags
        return [k.kv_worker_meta(worker_id, model), k.kv_worker(worker_id, model), k.kv_worker_approx(worker_id, model),
                owners, tags]

    # ---- writers: the worker host and the reaper -----------------------------------------------
    async def apply(self, batch: KvEventBatch, *, slot: int, model: str, publish: bool = True) -> ApplyResult:
        """Apply one event batch atomically and append it to the ``kv-events`` stream (``publish``).

        Events apply in order. ``BlockStored.parent_hash`` is not needed: a chained hash already names
        its whole prefix. Removing a block the index does not list for the worker is a no-op."""
        keys = [*self._worker_keys(batch.worker_id, model), self.keys.kv_events_of(model)]
        args: list[ScriptArg] = [batch.worker_id, slot, batch.event_id, model, self.keys.kv_block_prefix(model), self.stream_maxlen,
                encode_kv_batch(batch) if publish else b"", owner_tag(batch.worker_id), self.shared_ttl_ms,
                *_ops(batch)]
        status, last, stored, removed = await self._apply(keys=keys, args=args)
        return ApplyResult(status.decode(), int(last), int(stored), int(removed))

    async def resync(self, worker_id: str, slot: int, model: str, block_hashes: Sequence[int], event_id: int,
                     *, publish: bool = True, tiers: Mapping[str, Sequence[int]] | None = None) -> int:
        """Replace everything the index holds for the worker with ``block_hashes`` (and what its own KV
        tiers hold, ``tiers``: ``host`` and ``disk``, written with the first call); the next batch
        expected is ``event_id + 1``. Returns the number of device blocks written.

        Atomic when the old and the new state each fit in one call (:data:`RESYNC_CHUNK_BLOCKS`);
        a larger state is written in several calls, during which the index under-reports the worker.
        The previous owner of the slot, if another worker, is purged first. The stream gets one batch
        per call: ``AllBlocksCleared`` then ``BlockStored`` (no parent: a set, not a chain)."""
        keys = [*self._worker_keys(worker_id, model), self.keys.kv_events_of(model)]
        hashes = list(block_hashes)
        prefix = self.keys.kv_block_prefix(model)
        written = 0
        for start in range(0, max(len(hashes), 1), RESYNC_CHUNK_BLOCKS):
            part = hashes[start:start + RESYNC_CHUNK_BLOCKS]
            first = start == 0
            events: list[KvEvent] = [AllBlocksCleared(), BlockStored(part)] if first else [BlockStored(part)]
            payload = encode_kv_batch(KvEventBatch(worker_id, event_id, events)) if publish else b""
            tier_hex = [hex_digits((tiers or {}).get(t, ())) if first else b"" for t in TIER_LETTERS]
            args: list[ScriptArg] = [worker_id, slot, event_id, model, prefix, self.stream_maxlen, payload, owner_tag(worker_id),
                    1 if first else 0, RESYNC_CHUNK_BLOCKS, hex_digits(part), *tier_hex]
            busy_with: set[str] = set()
            while True:
                reply = await self._resync(keys=keys, args=args)
                status = reply[0].decode()
                if status == "ok":
                    written += int(reply[1])
                    break
                if status == "busy":
                    owner = reply[1].decode()
                    if owner in busy_with:
                        await self._drop_ownership(slot, owner, model)  # its record is gone: nothing to purge
                    busy_with.add(owner)
                    await self.purge(owner, model)
                else:  # 'big': drop the old state in bounded steps, then write
                    await self.purge(worker_id, model)
        return written

    async def purge(self, worker_id: str, model: str | None = None) -> int:
        """Forget every block of the worker (dead, or its cache was cleared) and release its slot in
        the index. The slot and block prefix come from the index's own record of the worker, so this
        works after the registration expired (with hash tags the caller names the worker's model: its
        keys live in that model's slot). Runs in bounded steps; idempotent. Returns blocks cleared."""
        keys = self._worker_keys(worker_id, model)
        total = 0
        while True:
            more, n = await self._purge(keys=keys, args=[worker_id, PURGE_CHUNK_BLOCKS])
            total += int(n)
            if not int(more):
                return total

    async def expire_guesses(self, worker_ids: Sequence[str], model: str | None = None) -> int:
        """Drop the expired approximate-mode guesses of these workers (the reaper's sweep; with hash
        tags, workers of ``model`` only, one call per model). Returns how many."""
        if not worker_ids:
            return 0
        keys = [k for wid in worker_ids
                for k in (self.keys.kv_worker_approx(wid, model), self.keys.kv_worker_meta(wid, model))]
        return int(await self._expire(keys=keys, args=[APPROX_EXPIRE_PER_SWEEP]))

    async def _drop_ownership(self, slot: int, owner: str, model: str) -> None:
        """Forget an owner the index has no record of (someone deleted its keys by hand)."""
        owners, tags = self.keys.kv_slot_owners_of(model), self.keys.kv_slot_tags_of(model)
        if text(await self.client.hget(owners, slot) or b"") != owner:
            return
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hdel(owners, slot)
            pipe.setrange(tags, slot * 4, b"\0\0\0\0")
            await pipe.execute()

    # ---- readers: routers -----------------------------------------------------------------------
    async def read(
        self,
        model: str,
        chains: Sequence[Sequence[int]],
        slots: Sequence[int] | np.ndarray,
        *,
        with_sums: bool = False,
    ) -> IndexRead:
        """Everything a routing decision reads, in ONE round trip whatever the number of workers: per
        chain (one per distinct block size) the leading overlap of every slot, the slots' owner tags
        and, with ``with_sums``, the model's in-flight sums."""
        slot_arr = np.asarray(slots, dtype=np.int64)
        top = int(slot_arr.max()) + 1 if slot_arr.size else 1
        prefix = self.keys.kv_block_prefix(model).encode()
        packed = [pack_mget(prefix, chain) for chain in chains if chain]
        packed.append(_getrange(self.keys.kv_slot_tags_of(model), 4 * top))
        if with_sums:
            packed.append(_getrange(self.keys.router_inflight(model), 8 * top))
        replies = await self.channel.call(b"".join(packed), len(packed))
        overlaps = []
        it = iter(replies)
        for chain in chains:
            if not chain:
                overlaps.append(np.zeros(slot_arr.size, dtype=np.int64))
                continue
            values = next(it)
            try:
                values = values[: values.index(None)]  # the chain stops at the first block nobody holds
            except ValueError:
                pass
            overlaps.append(leading_overlaps(values, slot_arr))
        tags = _uint32_at(next(it), slot_arr)
        if with_sums:
            sums = next(it)
            decode, prefill = _uint32_at(sums, 2 * slot_arr), _uint32_at(sums, 2 * slot_arr + 1)
        else:
            decode = prefill = np.zeros(slot_arr.size, dtype=np.int64)
        return IndexRead(slot_arr, overlaps, tags, decode, prefill)

    async def overlaps(self, model: str, block_hashes: Sequence[int], slots: Sequence[int]) -> dict[int, int]:
        """Leading blocks of ``block_hashes`` held at each slot, in one round trip."""
        if not slots:
            return {}
        read = await self.read(model, [block_hashes], slots)
        return {int(s): int(o) for s, o in zip(read.slots, read.overlaps[0], strict=True)}

    async def owners(self, model: str | None = None) -> dict[int, str]:
        """slot -> worker whose bits the index holds there (with hash tags: in ``model``'s index)."""
        raw = await self.client.hgetall(self.keys.kv_slot_owners if model is None else self.keys.kv_slot_owners_of(model))
        return {int(s): text(w) for s, w in raw.items()}

    async def sizes(self, worker_ids: Sequence[str], model: str | None = None) -> dict[str, int]:
        """How many blocks the index lists for each worker (events and approximate guesses, its host and
        disk tiers' blocks included; with hash tags, workers of ``model``)."""
        async with self.client.pipeline(transaction=False) as pipe:
            for wid in worker_ids:
                pipe.scard(self.keys.kv_worker(wid, model))
                pipe.zcard(self.keys.kv_worker_approx(wid, model))
            counts = await pipe.execute()
        return {wid: int(counts[2 * i]) + int(counts[2 * i + 1]) for i, wid in enumerate(worker_ids)}
