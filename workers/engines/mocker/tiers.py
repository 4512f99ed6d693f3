"""The mocker's KV tiers: real tier stores (workers.kvbm) holding stand-ins for the KV bytes, and the
onboard time simulated from the tiers' configured bandwidths and latencies.

A block the cache registers is offloaded as it is reported (write-through, off the step's path). A request
whose prompt runs past the device cache's hit into blocks a tier holds reads them (a real, verified read of
the stand-ins) and waits the simulated time before it queues for admission; the scheduler then takes the
read blocks as computed, as it takes KV pulled from a prefill worker. The stand-ins are small, so budgets
count blocks at ``kv_bytes_per_block`` (workers.kvbm.host).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import cast

from core.messages import BlockRemoved, BlockStored, KvEvent, KvTier
from core.settings import KvbmSettings, MockerSettings
from workers.engines.base import EngineKvEvent, KvEventSink, emit_kv_events
from workers.engines.mocker.timing import prefill_ms
from workers.kvbm.credit import configured_onboard_s, format_credits, tier_credits
from workers.kvbm.tiers import Block, KvTiers, TierEvent

#: How often tier changes made off the event loop (the offload thread's) are sent on when no step runs.
EVENT_PUMP_S = 0.05


def stand_in(block_hash: int) -> bytes:
    """The bytes the mocker stores for a block: its hash, so a read of the wrong block fails its check."""
    return (block_hash & ((1 << 64) - 1)).to_bytes(8, "little")


def kv_events(changes: Sequence[TierEvent]) -> list[KvEvent]:
    """Tier changes as the index's KV events: stored blocks as one event per run of a chain (each block the
    child of the one before it), with the run's parent, as the engine's own events are."""
    out: list[KvEvent] = []
    for c in changes:
        tier = cast(KvTier, c.tier)
        if not c.stored:
            out.append(BlockRemoved(block_hashes=list(c.block_hashes), tier=tier))
            continue
        parents = c.parents if c.parents is not None else [None] * len(c.block_hashes)
        run: list[int] = []
        first_parent: int | None = None
        for h, up in zip(c.block_hashes, parents, strict=True):
            if run and up == run[-1]:
                run.append(h)
                continue
            if run:
                out.append(BlockStored(block_hashes=run, parent_hash=first_parent, tier=tier))
            run, first_parent = [h], up
        if run:
            out.append(BlockStored(block_hashes=run, parent_hash=first_parent, tier=tier))
    return out


class MockerTiers:
    def __init__(self, store: KvTiers, settings: MockerSettings, kvbm: KvbmSettings) -> None:
        self.store = store
        self.settings = settings
        self.kvbm = kvbm
        self._sink: KvEventSink | None = None
        self._pump: asyncio.Task[None] | None = None
        #: The tiers worth reading: those whose simulated read beats recomputing (a credit above 0).
        self.worth = [t for t, c in self._credits().items() if c > 0]

    # ---- events -----------------------------------------------------------------------------------
    def wrap(self, sink: KvEventSink) -> KvEventSink:
        """The sink the scheduler reports to: device blocks stored are offloaded, then every event and
        the tiers' own changes go on to ``sink``."""
        self._sink = sink

        def tiered(events: Sequence[EngineKvEvent]) -> None:
            offload: list[Block] = []
            for e in events:
                if isinstance(e, BlockStored) and e.tier == "device":
                    parents = [e.parent_hash, *e.block_hashes[:-1]]
                    offload.extend((h, stand_in(h), up) for h, up in zip(e.block_hashes, parents, strict=True))
            if offload:
                self.store.offload(offload)
            emit_kv_events(sink, [*events, *kv_events(self.store.take_events())])

        return tiered

    def start(self) -> None:
        self._pump = asyncio.get_running_loop().create_task(self._pump_events(), name="mocker-tier-events")

    async def _pump_events(self) -> None:
        while True:
            await asyncio.sleep(EVENT_PUMP_S)
            changes = self.store.take_events()
            if changes and self._sink is not None:
                emit_kv_events(self._sink, kv_events(changes))

    # ---- onboard ----------------------------------------------------------------------------------
    def might_hold(self, chain: Sequence[int]) -> bool:
        """Whether an onboard could find anything worth reading (the shared tier is asked off the loop, so it
        may)."""
        return bool(chain) and (self.store.shared is not None and "shared" in self.worth
                                or any(chain[0] in t for t in self.store.local if t.name in self.worth))

    def peek(self, chain: Sequence[int]) -> list[str]:
        """The tier an onboard of ``chain`` now would read each block of its leading run from (only the tiers
        worth reading), reading nothing (a simulation's reference policy)."""
        return self.store.locate(chain, self.worth)

    async def onboard(self, chain: Sequence[int], parent: int | None) -> int:
        """Read the leading run of ``chain`` (whose first block's parent is ``parent``) the tiers hold and
        wait its simulated time; returns the blocks read (0 when none: the request recomputes)."""
        if self.store.inline:  # a simulation: the read happens at once, then exactly the simulated time passes
            read = self.store.onboard(list(chain), parent, self.worth)
            if read.payloads:
                await asyncio.sleep(self.simulated_s(read.tiers))
            return len(read.payloads)
        start = time.monotonic()
        read = await asyncio.to_thread(self.store.onboard, list(chain), parent, self.worth)
        if not read.payloads:
            return 0
        await asyncio.sleep(max(0.0, self.simulated_s(read.tiers) - (time.monotonic() - start)))
        return len(read.payloads)

    def simulated_s(self, tiers: Sequence[str]) -> float:
        """The simulated time of reading blocks from ``tiers`` (one entry per block): each tier read once,
        its latency plus its blocks at its bandwidth; 0 with ``no_sleep``."""
        if self.settings.no_sleep:
            return 0.0
        block_bytes = self.settings.kv_bytes_per_block
        return sum(self.kvbm.read_s(tier, tiers.count(tier), block_bytes) for tier in set(tiers)) / self.settings.speedup

    # ---- what the router is told ------------------------------------------------------------------
    def credits(self) -> str:
        """Each tier's credit against this mocker's prefill time per block (workers.kvbm.credit)."""
        return format_credits(self._credits())

    def _credits(self) -> dict[str, float]:
        s = self.settings
        n = s.max_num_batched_tokens
        prefill_s_per_block = (prefill_ms(n) / n) * s.block_size / 1000.0 / s.speedup
        onboard = {t: configured_onboard_s(self.kvbm, t, s.kv_bytes_per_block) / s.speedup for t in self.store.names}
        return tier_credits(onboard, prefill_s_per_block)

    async def close(self) -> None:
        if self._pump is not None:
            self._pump.cancel()
            try:
                await self._pump
            except asyncio.CancelledError:
                pass
        if self.store.inline:
            self.store.close()
        else:
            await asyncio.to_thread(self.store.close)
