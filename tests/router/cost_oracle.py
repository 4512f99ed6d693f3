"""The tests' oracle for KV-aware routing's cost and pick: the formulas of router.scoring (blocks) and
router.time_cost (time) in numpy, in the same order of operations as the deciding script in Redis
(router/lua/decide.lua), which is the implementation; and :func:`oracle_best`, the decision a policy's
script should make, computed here from a plain read of the index."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from router.hashing import block_hashes, root_hash, token_bytes
from router.kv_policy import KvPolicy
from router.policies import RouteDecision, RouteRequest
from router.registry import LiveWorker
from router.time_cost import TimeWeights


@dataclass(frozen=True, slots=True)
class CostTerms:
    """The parts of each worker's cost that do not depend on the shared in-flight sums, so that
    ``cost = static + queued_weight × queued + decode_weight × max(active, predicted)`` (this order of
    operations is also the one the routing script in Redis evaluates, so both agree to the last bit)."""

    static: np.ndarray
    queued_weight: np.ndarray
    decode_weight: np.ndarray
    active: np.ndarray


def cost_terms(
    prompt: Sequence[int] | np.ndarray,
    overlap: Sequence[int] | np.ndarray,
    active: Sequence[int] | np.ndarray,
    block_sizes: Sequence[int] | np.ndarray,
    *,
    weight: float,
) -> CostTerms:
    """``scale = B_w / B_min``; ``static = scale × weight × (prompt − overlap)``;
    ``queued_weight = scale × weight``; ``decode_weight = scale``."""
    sizes = np.asarray(block_sizes, dtype=np.float64)
    scale = sizes / sizes.min()
    uncached = np.asarray(prompt, dtype=np.float64) - np.asarray(overlap, dtype=np.float64)
    return CostTerms(static=scale * weight * uncached, queued_weight=scale * weight, decode_weight=scale,
                     active=np.asarray(active, dtype=np.float64))


def evaluate(terms: CostTerms, queued_prefill: Sequence[int] | np.ndarray,
             predicted: Sequence[int] | np.ndarray) -> np.ndarray:
    """The costs given the in-flight sums (see :class:`CostTerms`)."""
    queued = np.asarray(queued_prefill, dtype=np.float64)
    decode = np.maximum(terms.active, np.asarray(predicted, dtype=np.float64))
    costs: np.ndarray = terms.static + terms.queued_weight * queued + terms.decode_weight * decode
    return costs


def kv_costs(
    prompt: Sequence[int] | np.ndarray,
    overlap: Sequence[int] | np.ndarray,
    queued_prefill: Sequence[int] | np.ndarray,
    active: Sequence[int] | np.ndarray,
    predicted: Sequence[int] | np.ndarray,
    block_sizes: Sequence[int] | np.ndarray,
    *,
    weight: float,
) -> np.ndarray:
    """``cost_w = (B_w / B_min) × (weight × (prompt_w − overlap_w + queued_w) + max(active_w, predicted_w))``,
    elementwise over the workers (see the module docstring for the terms)."""
    return evaluate(cost_terms(prompt, overlap, active, block_sizes, weight=weight), queued_prefill, predicted)


def pick_index(costs: Sequence[float] | np.ndarray, temperature: float, u: float) -> int:
    """The chosen index, given ``u`` drawn uniformly from [0, 1).

    ``temperature == 0``: among the ``k`` indices of minimum cost (in order), the ``floor(u × k)``-th.
    ``temperature > 0``: index ``i`` with probability ``exp(−(c_i − c_min)/T) / Σ_j exp(−(c_j − c_min)/T)``,
    i.e. ``softmax(−cost / T)`` (shifting by ``c_min`` changes nothing but avoids underflow): the first
    index whose cumulative weight exceeds ``u ×`` the total."""
    c = np.asarray(costs, dtype=np.float64)
    if c.size == 0:
        raise ValueError("no costs to pick from")
    low = c.min()
    if temperature <= 0:
        best = np.flatnonzero(c == low)
        return int(best[int(u * best.size)])
    cumulative = np.cumsum(np.exp(-(c - low) / temperature))
    return int(min(np.searchsorted(cumulative, u * cumulative[-1], side="right"), c.size - 1))


def softmax_probabilities(costs: Sequence[float] | np.ndarray, temperature: float) -> np.ndarray:
    """The distribution :func:`pick_index` samples from when ``temperature > 0``."""
    c = np.asarray(costs, dtype=np.float64)
    weights = np.exp(-(c - c.min()) / temperature)
    probabilities: np.ndarray = weights / weights.sum()
    return probabilities


def _pre(cols: np.ndarray, t: np.ndarray) -> np.ndarray:
    value = cols[:, 0] + cols[:, 1] * t + cols[:, 2] * t * t
    return np.where(t > 0, np.maximum(value, 0.0), 0.0)


def _prefill(cols: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``prefill(n)`` and its step count ``k`` (elementwise)."""
    m = cols[:, 6]
    k = np.ceil(n / m)
    full = np.maximum(k - 1, 0.0)
    return full * _pre(cols, m) + _pre(cols, n - full * m), k


def time_costs(prompt: Sequence[int] | np.ndarray, overlap: Sequence[int] | np.ndarray,
               queued: Sequence[int] | np.ndarray, active: Sequence[int] | np.ndarray,
               predicted: Sequence[int] | np.ndarray, cols: np.ndarray, weights: TimeWeights,
               device_overlap: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
    """The cost of each candidate (aligned arrays; ``queued``/``predicted``: the routers' in-flight
    sums of queued prefill and decode blocks, ``active``: the heartbeat's blocks; ``overlap`` the
    credited overlap and ``device_overlap`` the blocks the device holds, ``overlap`` when not given)."""
    bs = cols[:, 9]
    blocks = np.asarray(prompt, dtype=np.float64) - np.asarray(overlap, dtype=np.float64)
    own = np.maximum(blocks * bs, 1.0)
    q_blocks = np.asarray(queued, dtype=np.float64)
    q = q_blocks * bs
    busy = np.maximum(np.asarray(active, dtype=np.float64), np.asarray(predicted, dtype=np.float64))
    total, k = _prefill(cols, q + own)
    before, _ = _prefill(cols, q)
    u = np.minimum(busy / cols[:, 7], 1.0)
    dec = np.where(busy > 0, np.maximum(cols[:, 3] + cols[:, 4] * u + cols[:, 5] * u * u, 0.0), 0.0)
    ttft = total + k * dec + dec * 0.5
    slowdown = cols[:, 8] * (total - before)
    held = np.asarray(overlap if device_overlap is None else device_overlap, dtype=np.float64)
    new = np.asarray(prompt, dtype=np.float64) - held  # onboarded tier blocks take device room too
    evicted = np.maximum(new - (cols[:, 7] - np.maximum(cols[:, 10], busy) - q_blocks), 0.0)
    costs: np.ndarray = ttft + weights.slowdown * slowdown + weights.eviction * (evicted * bs * cols[:, 1])
    return costs


async def oracle_best(policy: KvPolicy, request: RouteRequest, workers: Sequence[LiveWorker], u: float) -> RouteDecision:
    """The decision ``policy`` should make for ``request`` over ``workers`` with the uniform draw ``u``:
    the index and the in-flight sums read as they are (one plain read), scored and picked in numpy."""
    over, settings = request.overrides, policy.settings
    table = policy._table(request.model, workers)
    n = len(workers)
    tokens = token_bytes(request.token_ids)
    root = root_hash(request.model, request.lora)
    chains = [block_hashes(tokens, bs, root) for bs in table.roster.block_sizes]
    indexed = table.roster.indexed
    read = await policy.index.read(request.model, chains, table.roster.slots[indexed], with_sums=True)
    overlap = np.zeros(n, dtype=np.int64)
    decode = np.zeros(n, dtype=np.int64)
    prefill = np.zeros(n, dtype=np.int64)
    if indexed.size:
        # Bits at a slot count only while the index says the slot is this worker's (not a gone one's).
        held = read.overlaps[0] if len(chains) == 1 else \
            np.stack(read.overlaps)[table.roster.chain_no[indexed], np.arange(indexed.size)]
        overlap[indexed] = np.where(read.tags == table.roster.tags, held, 0)
        decode[indexed], prefill[indexed] = read.decode, read.prefill
    prompt = -(-(len(tokens) // 4) // table.roster.sizes)
    weights = policy._time_weights(over)
    if weights is None:
        weight = settings.overlap_score_weight if over.overlap_score_weight is None else over.overlap_score_weight
        costs = evaluate(cost_terms(prompt, overlap, table.active, table.roster.sizes, weight=weight), prefill, decode)
    else:
        costs = time_costs(prompt, overlap, prefill, table.active, decode, table.timing, weights)
    temperature = settings.temperature if over.temperature is None else over.temperature
    pinned = table.roster.position.get(over.worker_id) if over.worker_id else None
    idx = pinned if pinned is not None else pick_index(costs, temperature, u)
    record = table.workers[idx].record
    return RouteDecision(worker_id=record.worker_id, queue=record.queue, overlap_blocks=int(overlap[idx]),
                         cost=float(costs[idx]))
