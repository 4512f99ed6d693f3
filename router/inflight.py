"""The routers' shared in-flight predictions: what every frontend has routed and not yet released.

Per model (core.keys): a string of per-slot sums (decode blocks, prefill blocks not computed yet; two
big-endian uint32 per worker slot, so a router reads every worker's sums with one ``GETRANGE`` in the
same round trip as the bitmaps); a hash request_id -> its prediction; a sorted set of expiries, so
the predictions of a frontend that died without releasing vanish after ``RouterSettings.inflight_ttl_s``.

A decision is scored, made and recorded in one atomic script call (:meth:`InflightStore.decide`): the
router sends the prompt's hex chain and names its candidate table (:class:`Candidates`, sent with the
first decision over it and kept in Redis for the next ones); the script reads the bitmaps, the owner
tags and the current sums, computes the costs, picks and records. Frontends routing at the same moment therefore
take turns, each seeing every prediction recorded before its own, and cannot pile onto one worker.

Sums are per slot: when a dead worker's slot is recycled, its unreleased predictions still count on
the slot until their frontends release them (its requests fail over and end) or they expire.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from core.keys import ROUTER_TABLE_TTL_MS, Keys
from core.redis_topology import IndexClient
from core.redis_values import text
from core.wire import TaskParts
from router import index_scripts
from router.cluster_channel import ClusterChannel, routing_channel
from router.decide_layout import ARGS
from router.resp import hex_digits, pack_args
from router.resp_channel import PackedScript, RespChannel
from router.time_cost import TimeWeights

#: A decision's table arguments when the table is stored already: TTL 0 and no table.
_REFERENCE = pack_args(0, b"")
#: The status of a decision that named a table Redis does not hold.
_TABLE_MISSING = b"table"

#: A decision's arguments, packed in four parts: per request (head), the candidate table or a reference
#: to the stored one, the table's shape (per table, packed once) and the rest (tail); in the order
#: router.decide_layout declares (the deciding script reads them from there).
_HEAD = ("rid", "prediction_ttl_ms", "u", "temperature", "pinned", "weight")
_TABLE = ("table_ttl_ms", "sent")
_SHAPE = ("n", "nslots")
_TAIL = ("model", "prefix", "approx_ttl_ms", "task_head", "task_tail", "broker_prefix", "cost_kind",
         "slowdown_weight", "eviction_weight", "dry", "tiers", "nchains")
if _HEAD + _TABLE + _SHAPE + _TAIL != ARGS:
    raise ImportError("router.inflight packs DECIDE's arguments out of router.decide_layout's order")


@dataclass(frozen=True, slots=True)
class PackedRoster:
    """The part of a candidate table that depends on the registrations alone (router.worker_table keeps it
    across registry refreshes): the call's fixed keys (sums, requests, expiry, slot owners, slot tags),
    the keys of the approximate candidates (approx zset and meta each), and the table's columns that
    do not change with the loads, packed as the script reads them."""

    keys: list[str]
    approx_keys: list[str]
    slots: bytes
    lookup: bytes
    #: scale, chain and owner tag columns, contiguous in the table.
    static: bytes
    #: cold columns and names, the table's tail.
    tail: bytes


@dataclass(frozen=True, slots=True)
class Candidates:
    """The workers a decision may pick, packed once per candidate list (the frontend reuses it while its
    registry snapshot stands). ``table_id`` names the packed table once it is stored in Redis
    (``Keys.router_table``, by :meth:`InflightStore.store` or by the first decision over it); ``table`` is
    what is stored, and ``packed_shape`` its number of candidates and of slot lookup entries (sent with
    every decision).
    The table is one string of little-endian columns, each read only by the decisions that need it:
    slots (int32), active blocks (int32), slot lookup (uint16 per slot), scale (double), chain number
    (uint8), owner tag (uint32), the ``time`` cost's columns (11 floats), the KV tiers' credits (3 floats:
    host, disk, shared; ``tiered`` says whether any is above 0), cold columns (6 doubles:
    approx cap, approx number, offset and length of the worker id and of the queue in the names) and
    the worker ids and queues, concatenated. See router/lua/decide.lua."""

    table_id: str
    n_keys: int
    packed_keys: bytes
    table: bytes
    packed_shape: bytes
    #: The id of the table this one replaces (the same pool's previous one): dropped when this one is stored.
    replaces: str | None = None
    #: Some candidate credits blocks in KV tiers: decisions read the tiers' keys (else none of them).
    tiered: bool = False


@dataclass(frozen=True, slots=True)
class Decision:
    """``index`` into the candidates; ``cost`` and ``overlap`` (leading prompt blocks it holds) of that one;
    ``approx_status``: '' (not approximate), 'ok' (guesses recorded) or 'busy' (its slot still holds
    a gone worker's bits: no guesses recorded)."""

    index: int
    cost: float
    overlap: int
    approx_status: str


class InflightStore:
    def __init__(self, client: IndexClient, keys: Keys, ttl_s: float,
                 channel: RespChannel | ClusterChannel | None = None) -> None:
        self.client = client
        self.keys = keys
        self.ttl_ms = int(ttl_s * 1000)
        self.channel = channel or routing_channel(client)
        self._decide = PackedScript(self.channel, index_scripts.DECIDE)
        self._release = PackedScript(self.channel, index_scripts.RELEASE)
        #: When a decision last sent each candidate table's columns to be stored (monotonic), by table id.
        self._stored: dict[str, float] = {}

    def _keys(self, model: str) -> list[str]:
        k = self.keys
        return [k.router_inflight(model), k.router_inflight_requests(model), k.router_inflight_expiry(model)]

    def roster(self, model: str, worker_ids: Sequence[str], queues: Sequence[str], slots: np.ndarray,
               scale: np.ndarray, chain: np.ndarray, approx_cap: np.ndarray, tags: np.ndarray) -> PackedRoster:
        """Pack what a candidate list's registrations say (aligned arrays): ``queues`` = each worker's own
        queue, ``scale`` = B_w / B_min, ``chain`` = the number of the chain of its block size (0-based),
        ``approx_cap`` > 0: approximate mode with at most that many guesses, ``tags`` the owner tags of
        the ids (router.prefix_index.owner_tag)."""
        n = len(worker_ids)
        if n >= 1 << 16:
            raise ValueError(f"{n} candidates: the slot lookup holds at most 65535")
        if n and int(np.max(chain)) >= 255:
            raise ValueError("at most 255 distinct block sizes among the candidates")
        slots = np.asarray(slots, dtype=np.int64)
        keys = [*self._keys(model), self.keys.kv_slot_owners_of(model), self.keys.kv_slot_tags_of(model)]
        approx = np.flatnonzero(np.asarray(approx_cap) > 0)
        approx_keys = [key for i in approx.tolist() for key in (self.keys.kv_worker_approx(worker_ids[i], model),
                                                        self.keys.kv_worker_meta(worker_ids[i], model))]
        approx_no = np.zeros(n)
        approx_no[approx] = np.arange(1, approx.size + 1)
        # Worker ids and queues, concatenated; the cold columns say where each one is.
        names = [part.encode() for pair in zip(worker_ids, queues, strict=True) for part in pair]
        lengths = np.fromiter(map(len, names), dtype=np.int64, count=2 * n)
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        cold = np.column_stack([approx_cap, approx_no, offsets[0::2], lengths[0::2], offsets[1::2],
                                lengths[1::2]]).astype("<f8")
        indexed = np.flatnonzero(slots >= 0)
        lookup = np.zeros(int(slots.max()) + 1 if indexed.size else 0, dtype="<u2")
        lookup[slots[indexed]] = indexed + 1
        static = b"".join((np.asarray(scale, dtype="<f8").tobytes(), (np.asarray(chain) + 1).astype("u1").tobytes(),
                           np.asarray(tags, dtype="<u4").tobytes()))
        return PackedRoster(keys=keys, approx_keys=approx_keys, slots=slots.astype("<i4").tobytes(),
                            lookup=lookup.tobytes(), static=static, tail=cold.tobytes() + b"".join(names))

    def candidates(self, model: str, roster: PackedRoster, active: np.ndarray, timing: np.ndarray, table_id: str,
                   replaces: str | None = None, tier_credit: np.ndarray | None = None) -> Candidates:
        """The candidate table ``table_id``: ``roster`` with each worker's ``active`` blocks (heartbeat
        load), ``timing`` (the ``time`` cost's columns, router.time_cost) and ``tier_credit`` (one row of
        host, disk and shared credits each; None: no tiers). ``replaces``: the id of the table it
        replaces, if any."""
        credits = np.zeros((len(active), 3)) if tier_credit is None else np.asarray(tier_credit, dtype=np.float64)
        own = self.keys.router_table(model, table_id)
        keys = [*roster.keys, own, self.keys.router_table(model, replaces) if replaces else own, *roster.approx_keys]
        table = b"".join((roster.slots, np.asarray(active, dtype="<i4").tobytes(), roster.lookup, roster.static,
                          np.asarray(timing).astype("<f4").tobytes(), credits.astype("<f4").tobytes(), roster.tail))
        return Candidates(table_id=table_id, n_keys=len(keys), packed_keys=pack_args(*keys), replaces=replaces,
                          table=table, packed_shape=pack_args(len(active), len(roster.lookup) // 2),
                          tiered=bool(np.any(credits > 0)))

    async def decide(
        self,
        model: str,
        request_id: str,
        candidates: Candidates,
        chains: Sequence[Sequence[int]],
        prompt_blocks: Sequence[int],
        *,
        weight: float,
        temperature: float,
        u: float,
        pinned: int | None = None,
        approx_ttl_s: float = 0.0,
        task: TaskParts | None = None,
        settle: Sequence[tuple[str, str]] = (),
        time_weights: TimeWeights | None = None,
        dry: bool = False,
    ) -> Decision:
        """Score the prompt's ``chains`` (one per distinct block size, in the candidates' chain
        numbering; ``prompt_blocks`` the prompt's length in blocks of each) against the index, pick on the
        current sums (router.scoring's or router.time_cost's cost; the least, ties and samples by ``u``,
        or ``pinned``), record the prediction and, given a ``task``, push it onto the chosen worker's queue
        (its list under the namespace's broker prefix, core.keys): one atomic call, one round trip. ``settle``: operations
        as :meth:`settle` takes them, applied first in the same call.
        The candidates' columns go with the first decision over them, which stores them in Redis
        (``Keys.router_table``); the decisions after it send only the table's id. A decision that finds
        the table gone (it expired, Redis restarted) changes nothing and is sent again with the columns:
        the one case of two round trips.
        A prediction with the same request id replaces the earlier one. ``time_weights``: score with
        the ``time`` cost (router.time_cost; the candidates need their timing columns), else ``blocks``.
        ``dry``: decide only; nothing is recorded, pushed or settled (``task`` and ``settle`` must be empty)."""
        if dry and (task is not None or settle):
            raise ValueError("a dry decision pushes no task and settles nothing")
        per_chain = [x for chain, blocks in zip(chains, prompt_blocks, strict=True)
                     for x in (blocks, hex_digits(chain))]
        head = pack_args(request_id.encode(), self.ttl_ms, repr(float(u)), repr(float(temperature)),
                         0 if pinned is None else pinned + 1, repr(float(weight)))
        tail = b"".join((
            pack_args(model, self.keys.kv_block_prefix(model), int(approx_ttl_s * 1000),
                      *((task.head, task.tail) if task is not None else (b"", b"")), self.keys.broker_prefix,
                      b"time" if time_weights is not None else b"blocks",
                      repr(float(time_weights.slowdown if time_weights else 0.0)),
                      repr(float(time_weights.eviction if time_weights else 0.0)),
                      1 if dry else 0, 1 if candidates.tiered else 0, len(chains), *per_chain),
            pack_args(*(x.encode() for op in settle for x in op)),
        ))
        n_args = len(ARGS) + len(per_chain) + 2 * len(settle)
        reply = await self._decide_with(candidates, head, tail, n_args, self._stores(candidates))
        if reply[3] == _TABLE_MISSING:  # expired, or Redis restarted: this call stores it again
            reply = await self._decide_with(candidates, head, tail, n_args, True)
        chosen, cost, overlap, approx = reply
        return Decision(int(chosen) - 1, float(cost), int(overlap), text(cast(bytes, approx)))

    async def store(self, model: str, candidates: Candidates) -> None:
        """Store the candidate table now (and drop the one it replaces) unless a decision stored it lately,
        so that the next decision over it sends only its id: the frontend's worker directory does this
        after each registry refresh, off the request path. A failure leaves it to that decision."""
        if not self._stores(candidates):
            return
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.set(self.keys.router_table(model, candidates.table_id), candidates.table, px=ROUTER_TABLE_TTL_MS)
            if candidates.replaces is not None:
                pipe.delete(self.keys.router_table(model, candidates.replaces))
            await pipe.execute()
        self._mark_stored(candidates)

    def _mark_stored(self, candidates: Candidates) -> None:
        self._stored[candidates.table_id] = time.monotonic()
        if candidates.replaces is not None:
            self._stored.pop(candidates.replaces, None)

    def _stores(self, candidates: Candidates) -> bool:
        """Whether the next decision over ``candidates`` sends its columns to store them: the first one,
        and then one every half of the stored table's lifetime (a decision sent after one that stores
        the table on the same connection finds it stored, as Redis runs a connection's calls in order)."""
        sent = self._stored.get(candidates.table_id)
        return sent is None or time.monotonic() - sent > ROUTER_TABLE_TTL_MS / 2000

    async def _decide_with(self, candidates: Candidates, head: bytes, tail: bytes, n_args: int,
                           store: bool) -> list[bytes | int]:
        if store:
            self._mark_stored(candidates)
        middle = (pack_args(ROUTER_TABLE_TTL_MS, candidates.table) if store else _REFERENCE) + candidates.packed_shape
        try:
            reply = await self._decide.call_packed(candidates.n_keys, candidates.packed_keys, n_args,
                                                   b"".join((head, middle, tail)))
            return cast(list[bytes | int], reply)
        except BaseException:
            if store:
                self._stored.pop(candidates.table_id, None)
            raise

    async def settle(self, model: str, ops: Sequence[tuple[str, str]]) -> int:
        """Apply ``(request_id, 'all' | 'prefill')`` operations in order, in one call. Returns how many
        found their prediction."""
        if not ops:
            return 0
        return int(await self._release(self._keys(model), [x.encode() for op in ops for x in op]))
