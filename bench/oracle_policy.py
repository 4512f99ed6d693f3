"""A reference policy for the routing-quality benchmark that no real router could run: it reads every
engine's actual state.

For each worker it predicts the request's first step on the engine as it is at that instant, with
the mocker's own timing model (workers.engines.mocker.timing): the prefill of everything waiting or
being prefilled there plus the request's own uncached tokens (the engine's real prefix-cache hit), and
the decode part if anything runs there; it picks the shortest (ties at random). It knows what the
``kv`` policy can only estimate (the exact cache, the exact queue, no heartbeat lag) and costs nothing
to run. It is greedy (it ignores what its choice does to later requests: evictions, queues), so it is a
reference point, not a bound: when ``kv`` comes out level with it, the remaining TTFT is the workload's
and the engine's (the step overheads and the misses nobody could avoid), not the router's.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from router.policies import RouteDecision, RouteRequest
from router.registry import LiveWorker
from workers.engines.mocker.engine import MockerEngine
from workers.engines.mocker.timing import decode_ms, prefill_ms


class TtftOracle:
    """The ``oracle`` row of bench.router_quality (same interface as router.policies.Policy)."""

    def __init__(self, engines: Mapping[str, MockerEngine], rng: random.Random, tiers: bool = False) -> None:
        self.engines = engines
        self.rng = rng
        #: Also know what each engine's KV tiers would onboard, and the read's time (the ``oracle, tiers`` rows
        #: of bench.kvbm_bench); off: only the device cache's hit counts, as with no tiers.
        self.tiers = tiers

    def predicted_ms(self, engine: MockerEngine, token_ids: Sequence[int], lora: str | None) -> float:
        own = len(token_ids) - engine.prompt_hit_tokens(token_ids, lora)
        onboard_ms = 0.0
        if self.tiers:
            read, seconds = engine.prompt_tier_read(token_ids, lora)
            own, onboard_ms = own - read, seconds * 1000.0
        load = engine.load()
        step = prefill_ms(engine.pending_prefill_tokens() + own)
        return onboard_ms + step + (decode_ms(load.active_blocks / load.total_blocks) if load.running else 0.0)

    async def choose(self, request: RouteRequest, workers: Sequence[LiveWorker]) -> RouteDecision:
        scored = [(self.predicted_ms(self.engines[w.record.worker_id], request.token_ids, request.lora),
                   self.rng.random(), w) for w in workers]
        cost, _, best = min(scored, key=lambda x: x[:2])
        return RouteDecision(worker_id=best.record.worker_id, queue=best.record.queue, overlap_blocks=0, cost=cost)

    def prefill_done(self, request_id: str) -> None:
        pass

    def release(self, request_id: str) -> None:
        pass
