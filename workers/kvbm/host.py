"""The host-memory tier: frames under a byte budget, prefix-closed, with a frequency filter. Thread-safe.

Budgets count every block at the engine's nominal frame size (``frame_bytes``: a block's KV bytes plus
the frame's header), whatever the frame holds: the mocker stores small stand-ins for the bytes it
simulates, and its tiers must fill as real ones would.

Eviction takes the least recently used *leaf* (workers.kvbm.chains): a chain leaves from its tail, so the
tier stays prefix-closed as the router's index needs. Admission: while there is room every block whose
parent is held is taken; once full, a new block is taken only if it has been offered or used at least as
often as the leaf it would evict (a small count table, halved every ``decay_every`` offers so old
popularity fades: TinyLFU's idea without its sketch), so a long one-off prompt cannot flush a prefix that
many conversations share.
"""

from __future__ import annotations

import threading

from workers.kvbm.chains import Chains


class HostTier:
    name = "host"

    def __init__(self, budget_bytes: int, frame_bytes: int, *, decay_every: int = 0) -> None:
        if budget_bytes < frame_bytes or frame_bytes <= 0:
            raise ValueError("the host tier's budget must hold at least one block")
        self.budget_bytes = budget_bytes
        self.frame_bytes = frame_bytes
        self.capacity = budget_bytes // frame_bytes
        self._frames: dict[int, bytes] = {}
        self._chains = Chains()
        self._seen: dict[int, int] = {}
        self._offers = 0
        self._decay_every = decay_every or 16 * self.capacity
        self._lock = threading.Lock()

    @property
    def used_bytes(self) -> int:
        return len(self._frames) * self.frame_bytes

    def __len__(self) -> int:
        return len(self._frames)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._frames

    def hashes(self) -> list[int]:
        with self._lock:
            return list(self._frames)

    def parent_of(self, block_hash: int) -> int | None:
        return self._chains.parent.get(block_hash)

    def get(self, block_hash: int) -> bytes | None:
        with self._lock:
            frame = self._frames.get(block_hash)
            if frame is not None:
                self._chains.use(block_hash)
                self._count(block_hash)
            return frame

    def touch(self, block_hashes: list[int]) -> None:
        """Blocks a request used from the engine's own cache: a use for the filter and the LRU order."""
        with self._lock:
            for h in block_hashes:
                self._count(h)
                self._chains.use(h)

    def put(self, block_hash: int, frame: bytes, parent: int | None = None) -> tuple[bool, list[int]]:
        """Offer a frame (its chain's ``parent``: None at a root); returns whether it was taken and the blocks
        evicted to make room."""
        with self._lock:
            seen = self._count(block_hash)
            if block_hash in self._frames:
                self._chains.use(block_hash)
                return True, []
            if not self._chains.can_hold(parent):
                return False, []
            victims: list[int] = []
            if len(self._frames) >= self.capacity:
                victim = self._chains.victim()
                # Not the parent it needs, and not a block seen more often than this one.
                if victim is None or victim == parent or self._seen.get(victim, 0) > seen:
                    return False, []
                victims = self._chains.remove(victim)
                for v in victims:
                    del self._frames[v]
            self._chains.add(block_hash, parent)
            self._frames[block_hash] = frame
            return True, victims

    def discard(self, block_hash: int) -> list[int]:
        """Drop a block and its descendants (they would hang from nothing); returns them."""
        with self._lock:
            gone = self._chains.remove(block_hash)
            for h in gone:
                del self._frames[h]
            return gone

    def clear(self) -> list[int]:
        with self._lock:
            self._frames.clear()
            return self._chains.clear()

    def _count(self, block_hash: int) -> int:
        self._offers += 1
        if self._offers >= self._decay_every:
            self._offers = 0
            self._seen = {h: c // 2 for h, c in self._seen.items() if c > 1}
        count = self._seen.get(block_hash, 0) + 1
        self._seen[block_hash] = count
        return count
