"""KV event sinks and checkers for tests: what an engine reports, and whether it keeps the index's
invariant (router.prefix_index: each worker's cached blocks form prefix-closed chains)."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

from core.messages import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent, KvTier


class KvEventLog:
    """A KV event sink that records everything (engines may call it from their loop thread). Each
    call of the sink is one batch: what the relay would apply to the index atomically."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.events: list[KvEvent] = []
        self._batches: list[list[KvEvent]] = []

    def __call__(self, events: Sequence[KvEvent]) -> None:
        with self._lock:
            self.events.extend(events)
            self._batches.append(list(events))

    def batches(self) -> list[list[KvEvent]]:
        """Every batch so far, in the order the engine handed them over."""
        with self._lock:
            return [list(b) for b in self._batches]

    def replay(self, tier: KvTier = "device") -> set[int]:
        """The block hashes a router following these events would hold in ``tier`` (the engine's cache
        by default; AllBlocksCleared concerns the cache alone)."""
        held: set[int] = set()
        with self._lock:
            events = list(self.events)
        for ev in events:
            if isinstance(ev, BlockStored) and ev.tier == tier:
                held.update(ev.block_hashes)
            elif isinstance(ev, BlockRemoved) and ev.tier == tier:
                held.difference_update(ev.block_hashes)
            elif isinstance(ev, AllBlocksCleared) and tier == "device":
                held.clear()
        return held


class PrefixClosureViolation(AssertionError):
    """A worker held a block without its parent after a batch of its KV events."""


class PrefixClosureChecker:
    """Replays one worker's KV events and checks, after every batch, that the blocks it holds form
    prefix-closed chains: every held block whose parent is known (``BlockStored.parent_hash`` for the
    first block of an event, the previous block for the others; None at a chain's root) has that
    parent held too. The check is per batch, not per event, because a batch is what the index
    applies atomically: a router never sees the state between two events of one batch.

    Counts what it saw (``stored``, ``removed``, ``batches_checked``) so a test can assert its
    workload really stored shared prefixes and evicted blocks."""

    def __init__(self, tier: KvTier = "device") -> None:
        #: The tier whose events are checked (the others' are skipped).
        self.tier = tier
        #: held block -> its parent (None: a root).
        self.held: dict[int, int | None] = {}
        self.stored = 0
        self.removed = 0
        self.cleared = 0
        self.batches_checked = 0

    def apply(self, batch: Iterable[KvEvent]) -> None:
        """Apply one batch, then check; raises :class:`PrefixClosureViolation` naming the orphans."""
        for event in batch:
            if isinstance(event, BlockStored | BlockRemoved) and event.tier != self.tier:
                continue
            if isinstance(event, BlockStored):
                parent = event.parent_hash
                for h in event.block_hashes:
                    self.held[h] = parent
                    parent = h
                self.stored += len(event.block_hashes)
            elif isinstance(event, BlockRemoved):
                for h in event.block_hashes:
                    self.held.pop(h, None)
                self.removed += len(event.block_hashes)
            elif isinstance(event, AllBlocksCleared) and self.tier == "device":
                self.held.clear()
                self.cleared += 1
        self.batches_checked += 1
        orphans = self.orphans()
        if orphans:
            shown = ", ".join(f"{h:#x} (parent {p:#x})" for h, p in orphans[:5])
            raise PrefixClosureViolation(
                f"after batch {self.batches_checked}: {len(orphans)} held block(s) without their parent: {shown}")

    def orphans(self) -> list[tuple[int, int]]:
        """Held blocks whose parent is not held, with that parent."""
        return [(h, p) for h, p in self.held.items() if p is not None and p not in self.held]

    def replay(self, batches: Iterable[Iterable[KvEvent]]) -> PrefixClosureChecker:
        for batch in batches:
            self.apply(batch)
        return self
