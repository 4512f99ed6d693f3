"""The host-memory tier: frames in an LRU under a byte budget, with a frequency filter. Thread-safe.

Budgets count every block at the engine's nominal frame size (``frame_bytes``: a block's KV bytes plus
the frame's header), whatever the frame holds: the mocker stores small stand-ins for the bytes it
simulates, and its tiers must fill as real ones would.

Admission: while there is room, every block is taken. Once full, a new block is taken only if it has been
offered or read at least as often as the least recently used block it would evict (a small count table,
halved every ``decay_every`` offers so old popularity fades, TinyLFU's idea without its sketch): a long
one-off prompt cannot flush a prefix that many conversations share.
"""

from __future__ import annotations

import threading
from collections import OrderedDict


class HostTier:
    name = "host"

    def __init__(self, budget_bytes: int, frame_bytes: int, *, decay_every: int = 0) -> None:
        if budget_bytes < frame_bytes or frame_bytes <= 0:
            raise ValueError("the host tier's budget must hold at least one block")
        self.budget_bytes = budget_bytes
        self.frame_bytes = frame_bytes
        self.capacity = budget_bytes // frame_bytes
        self._frames: OrderedDict[int, bytes] = OrderedDict()
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

    def get(self, block_hash: int) -> bytes | None:
        with self._lock:
            frame = self._frames.get(block_hash)
            if frame is not None:
                self._frames.move_to_end(block_hash)
                self._count(block_hash)
            return frame

    def touch(self, block_hashes: list[int]) -> None:
        """Blocks a request used from the engine's own cache: a use for the filter and the LRU order."""
        with self._lock:
            for h in block_hashes:
                self._count(h)
                if h in self._frames:
                    self._frames.move_to_end(h)

    def put(self, block_hash: int, frame: bytes) -> tuple[bool, list[int]]:
        """Offer a frame; returns whether it was taken and the blocks evicted to make room."""
        with self._lock:
            seen = self._count(block_hash)
            if block_hash in self._frames:
                self._frames.move_to_end(block_hash)
                return True, []
            victims: list[int] = []
            if len(self._frames) >= self.capacity:
                # Full: the least recently used block goes, unless it was seen more often than this one.
                victim = next(iter(self._frames))
                if self._seen.get(victim, 0) > seen:
                    return False, []
                del self._frames[victim]
                victims.append(victim)
            self._frames[block_hash] = frame
            return True, victims

    def discard(self, block_hash: int) -> bool:
        with self._lock:
            return self._frames.pop(block_hash, None) is not None

    def clear(self) -> list[int]:
        with self._lock:
            gone = list(self._frames)
            self._frames.clear()
            return gone

    def _count(self, block_hash: int) -> int:
        self._offers += 1
        if self._offers >= self._decay_every:
            self._offers = 0
            self._seen = {h: c // 2 for h, c in self._seen.items() if c > 1}
        count = self._seen.get(block_hash, 0) + 1
        self._seen[block_hash] = count
        return count

