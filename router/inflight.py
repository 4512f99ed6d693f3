"""The routers' shared in-flight predictions: what every frontend has routed and not yet released.

Per model (core.keys): a string of per-slot sums (decode blocks, prefill blocks not computed yet; two
big-endian uint32 per worker slot, so a router reads every worker's sums with one ``GETRANGE`` in the
same round trip as the bitmaps); a hash request_id -> its prediction; a sorted set of expiries, so
the predictions of a frontend that died without releasing vanish after ``RouterSettings.inflight_ttl_s``.

A decision is made and recorded in one atomic script call (:meth:`InflightStore.decide`): the router
computes everything that does not depend on the sums (router.scoring.CostTerms), the script reads the
current sums, finishes the costs, picks and records. Frontends routing at the same moment therefore
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
from router import index_scripts
from router.prefix_index import hex_chain, owner_tag
from router.resp import PackedScript
from router.scoring import CostTerms


@dataclass(frozen=True, slots=True)
class Candidates:
    """The workers a decision may pick (aligned arrays) and the prediction recorded for the one picked:
    ``decode_blocks``, ``prefill_blocks`` on its ``slot``. ``approx_cap`` > 0: approximate mode, the
    prompt's blocks (chain number ``chain``, the one of its block size) become guesses, at most that many."""

    worker_ids: list[str]
    slots: np.ndarray
    decode_blocks: np.ndarray
    prefill_blocks: np.ndarray
    chain: np.ndarray
    approx_cap: np.ndarray


@dataclass(frozen=True, slots=True)
class Decision:
    index: int
    cost: float
    approx_status: str


class InflightStore:
    def __init__(self, client: aioredis.Redis, keys: Keys, ttl_s: float) -> None:
        self.client = client
        self.keys = keys
        self.ttl_ms = int(ttl_s * 1000)
        self._decide = PackedScript(client, index_scripts.DECIDE)
        self._release = client.register_script(index_scripts.RELEASE)

    def _keys(self, model: str) -> list[str]:
        k = self.keys
        return [k.router_inflight(model), k.router_inflight_requests(model), k.router_inflight_expiry(model)]

    async def decide(
        self,
        model: str,
        request_id: str,
        candidates: Candidates,
        terms: CostTerms,
        chains: Sequence[Sequence[int]],
        *,
        temperature: float,
        u: float,
        pinned: int | None = None,
        approx_ttl_s: float = 0.0,
    ) -> Decision:
        """Pick among ``candidates`` on the current sums (router.scoring.pick_index with ``u``, or
        ``pinned``) and record the prediction, atomically. A prediction with the same request id
        replaces the earlier one. ``chains`` (per block size) are needed only for approximate candidates."""
        keys = [*self._keys(model), self.keys.kv_slot_owners, self.keys.kv_slot_tags]
        approx = np.flatnonzero(candidates.approx_cap > 0)
        tags = np.zeros(len(candidates.worker_ids), dtype=np.float64)
        for i in approx:
            wid = candidates.worker_ids[i]
            keys += [self.keys.kv_worker_approx(wid), self.keys.kv_worker_meta(wid)]
            tags[i] = owner_tag(wid)
        cost_terms = np.column_stack([terms.static, terms.queued_weight, terms.decode_weight, terms.active,
                                      candidates.slots]).astype("<f8").tobytes()
        record_terms = np.column_stack([candidates.decode_blocks, candidates.prefill_blocks, candidates.approx_cap,
                                        candidates.chain, tags]).astype("<f8").tobytes()
        args = [request_id, self.ttl_ms, repr(float(u)), repr(float(temperature)),
                0 if pinned is None else pinned + 1, cost_terms, record_terms, model,
                self.keys.kv_block_prefix(model), int(approx_ttl_s * 1000), len(chains),
                *(hex_chain(ch) for ch in chains), *candidates.worker_ids]
        chosen, cost, approx = await self._decide(keys=keys, args=args)
        return Decision(int(chosen) - 1, float(cost), approx.decode())

    async def release(self, model: str, request_id: str) -> bool:
        """Forget the request's prediction (it finished). Returns whether there was one."""
        return bool(await self._release(keys=self._keys(model), args=[request_id, "all"]))

    async def prefill_done(self, model: str, request_id: str) -> bool:
        """The request's prompt is computed (first token out): its blocks stop counting as queued prefill."""
        return bool(await self._release(keys=self._keys(model), args=[request_id, "prefill"]))
