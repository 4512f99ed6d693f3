"""The routers' shared in-flight predictions: what every frontend has routed and not yet released.

Per model (core.keys): a string of per-slot sums (decode blocks, prefill blocks not computed yet; two
big-endian uint32 per worker slot, so a router reads every worker's sums with one ``GETRANGE`` in the
same round trip as the bitmaps); a hash request_id -> its prediction; a sorted set of expiries, so
the predictions of a frontend that died without releasing vanish after ``RouterSettings.inflight_ttl_s``.

A decision is scored, made and recorded in one atomic script call (:meth:`InflightStore.decide`): the
router sends the prompt's hex chain and the candidates' columns; the script reads the bitmaps, the
owner tags and the current sums, computes the costs, picks and records. Frontends routing at the same moment therefore
take turns, each seeing every prediction recorded before its own, and cannot pile onto one worker.

Sums are per slot: when a dead worker's slot is recycled, its unreleased predictions still count on
the slot until their frontends release them (its requests fail over and end) or they expire.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import redis.asyncio as aioredis

from core.keys import Keys
from core.wire import TaskParts
from router import index_scripts
from router.cluster_channel import ClusterChannel, routing_channel
from router.prefix_index import owner_tag
from router.resp import hex_digits, pack_args
from router.resp_channel import PackedScript, RespChannel
from router.time_cost import TimeWeights


@dataclass(frozen=True, slots=True)
class Candidates:
    """The workers a decision may pick, packed once per candidate list (the frontend reuses it while its
    registry snapshot stands): the fixed keys of the call (sums, requests, expiry, slot owners, slot tags,
    then an approx zset and meta per approximate candidate) and the script's candidate arguments (hot and
    cold columns, worker ids and queues, slot lookup). See ``index_scripts.DECIDE``."""

    n_keys: int
    packed_keys: bytes
    packed_args: bytes
    #: The ``time`` cost's columns as the script's argument (sent only with a decision that uses them).
    packed_timing: bytes = b""


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
    def __init__(self, client: aioredis.Redis, keys: Keys, ttl_s: float,
                 channel: RespChannel | ClusterChannel | None = None) -> None:
        self.client = client
        self.keys = keys
        self.ttl_ms = int(ttl_s * 1000)
        self.channel = channel or routing_channel(client)
        self._decide = PackedScript(self.channel, index_scripts.DECIDE)
        self._release = PackedScript(self.channel, index_scripts.RELEASE)

    def _keys(self, model: str) -> list[str]:
        k = self.keys
        return [k.router_inflight(model), k.router_inflight_requests(model), k.router_inflight_expiry(model)]

    def candidates(self, model: str, worker_ids: Sequence[str], queues: Sequence[str], slots: np.ndarray,
                   scale: np.ndarray, active: np.ndarray, chain: np.ndarray, approx_cap: np.ndarray,
                   timing: np.ndarray | None = None) -> Candidates:
        """Pack a candidate list (aligned arrays): ``queues`` = each worker's own queue,
        ``scale`` = B_w / B_min, ``active`` = heartbeat load,
        ``chain`` = the number of the chain of its block size (0-based), ``approx_cap`` > 0: approximate
        mode with at most that many guesses, ``timing`` the ``time`` cost's columns (router.time_cost;
        None: that cost is not used). Owner tags are derived from the ids."""
        n = len(worker_ids)
        if n >= 1 << 16:
            raise ValueError(f"{n} candidates: the slot lookup holds at most 65535")
        slots = np.asarray(slots, dtype=np.int64)
        keys = [*self._keys(model), self.keys.kv_slot_owners_of(model), self.keys.kv_slot_tags_of(model)]
        approx = np.flatnonzero(np.asarray(approx_cap) > 0)
        for i in approx:
            keys += [self.keys.kv_worker_approx(worker_ids[i], model), self.keys.kv_worker_meta(worker_ids[i], model)]
        approx_no = np.zeros(n)
        approx_no[approx] = np.arange(1, approx.size + 1)
        tags = np.fromiter((owner_tag(w) for w in worker_ids), dtype=np.float64, count=n)
        hot = np.column_stack([slots, scale, active, np.asarray(chain) + 1, tags]).astype("<f8")
        # Worker ids and queues, concatenated; the cold columns say where each one is.
        names = [part.encode() for pair in zip(worker_ids, queues, strict=True) for part in pair]
        lengths = np.fromiter(map(len, names), dtype=np.int64, count=2 * n)
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        cold = np.column_stack([approx_cap, approx_no, offsets[0::2], lengths[0::2], offsets[1::2],
                                lengths[1::2]]).astype("<f8")
        indexed = np.flatnonzero(slots >= 0)
        lookup = np.zeros(int(slots.max()) + 1 if indexed.size else 0, dtype="<u2")
        lookup[slots[indexed]] = indexed + 1
        return Candidates(n_keys=len(keys), packed_keys=pack_args(*keys),
                          packed_args=pack_args(hot.tobytes(), cold.tobytes(), b"".join(names), lookup.tobytes()),
                          packed_timing=pack_args(timing.astype("<f4").tobytes() if timing is not None else b""))

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
    ) -> Decision:
        """Score the prompt's ``chains`` (one per distinct block size, in the candidates' chain
        numbering; ``prompt_blocks`` the prompt's length in blocks of each) against the index, pick on the
        current sums (router.scoring's costs and pick_index with ``u``, or ``pinned``), record the
        prediction and, given a ``task``, push it onto the chosen worker's queue (its list under the
        namespace's broker prefix, core.keys): one atomic call, one round trip. ``settle``: operations
        as :meth:`settle` takes them, applied first in the same call.
        A prediction with the same request id replaces the earlier one. ``time_weights``: score with
        the ``time`` cost (router.time_cost; the candidates need their timing columns), else ``blocks``."""
        per_chain = [x for chain, blocks in zip(chains, prompt_blocks, strict=True)
                     for x in (blocks, hex_digits(chain))]
        args = b"".join((
            pack_args(request_id.encode(), self.ttl_ms, repr(float(u)), repr(float(temperature)),
                      0 if pinned is None else pinned + 1, repr(float(weight))),
            candidates.packed_args,
            candidates.packed_timing if time_weights is not None else pack_args(b""),
            pack_args(model, self.keys.kv_block_prefix(model), int(approx_ttl_s * 1000),
                      *((task.head, task.tail) if task is not None else (b"", b"")), self.keys.broker_prefix,
                      b"time" if time_weights is not None else b"blocks",
                      repr(float(time_weights.slowdown if time_weights else 0.0)),
                      repr(float(time_weights.eviction if time_weights else 0.0)),
                      len(chains), *per_chain),
            pack_args(*(x.encode() for op in settle for x in op)),
        ))
        chosen, cost, overlap, approx = await self._decide.call_packed(
            candidates.n_keys, candidates.packed_keys, 21 + len(per_chain) + 2 * len(settle), args)
        return Decision(int(chosen) - 1, float(cost), int(overlap), approx.decode())

    async def settle(self, model: str, ops: Sequence[tuple[str, str]]) -> int:
        """Apply ``(request_id, 'all' | 'prefill')`` operations in order, in one call. Returns how many
        found their prediction."""
        if not ops:
            return 0
        return int(await self._release(self._keys(model), [x.encode() for op in ops for x in op]))
