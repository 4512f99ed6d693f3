"""Which blocks a tier holds, as prefix-closed chains, and which one to evict next. Pure, not thread-safe
(the tiers lock around it).

A tier keeps the router's invariant (router/prefix_index.py): a block is held only with its parent. So a
block enters only when its parent is held (or it is a chain's root), and only leaves — blocks no held block
names as parent — are evicted, the least recently used first. A block dropped for another reason (its
frame failed its check) takes its descendants along, deepest first.
"""

from __future__ import annotations

import heapq
import itertools


class Chains:
    def __init__(self) -> None:
        self.parent: dict[int, int | None] = {}
        self._children: dict[int, set[int]] = {}
        self._used: dict[int, int] = {}  # block -> stamp of its last use
        self._leaves: list[tuple[int, int]] = []  # (stamp, block), lazily stale
        self._clock = itertools.count()

    def __len__(self) -> int:
        return len(self.parent)

    def __contains__(self, block: int) -> bool:
        return block in self.parent

    def __iter__(self):  # noqa: ANN204 - an iterator over the held blocks, oldest insertion first
        return iter(self.parent)

    def can_hold(self, parent: int | None) -> bool:
        """Whether a block with this parent may enter (its parent is held, or it starts a chain)."""
        return parent is None or parent in self.parent

    def add(self, block: int, parent: int | None, stamp: int | None = None) -> None:
        """Hold ``block`` (``can_hold`` must be true), used now (or at ``stamp``: a restart's order)."""
        self.parent[block] = parent
        self._children.setdefault(block, set())
        if parent is not None:
            self._children[parent].add(block)
        self.use(block, stamp)

    def use(self, block: int, stamp: int | None = None) -> None:
        if block not in self.parent:
            return
        now = next(self._clock) if stamp is None else stamp
        self._used[block] = now
        if not self._children[block]:
            heapq.heappush(self._leaves, (now, block))

    def victim(self) -> int | None:
        """The least recently used leaf (None when nothing is held)."""
        while self._leaves:
            stamp, block = self._leaves[0]
            if self._used.get(block) == stamp and not self._children.get(block, True):
                return block
            heapq.heappop(self._leaves)  # stale: used since, gone, or no longer a leaf
        return None

    def subtree(self, block: int) -> dict[int, int | None]:
        """``block`` and its descendants, each with its parent."""
        out: dict[int, int | None] = {}
        stack = [block] if block in self.parent else []
        while stack:
            b = stack.pop()
            out[b] = self.parent[b]
            stack.extend(self._children.get(b, ()))
        return out

    def remove(self, block: int) -> list[int]:
        """Drop ``block`` and every descendant; returns them, deepest first."""
        if block not in self.parent:
            return []
        gone: list[int] = []
        stack = [block]
        order: list[int] = []
        while stack:
            b = stack.pop()
            order.append(b)
            stack.extend(self._children.get(b, ()))
        for b in reversed(order):
            self._drop(b)
            gone.append(b)
        return gone

    def _drop(self, block: int) -> None:
        parent = self.parent.pop(block)
        self._children.pop(block, None)
        self._used.pop(block, None)
        if parent is not None and parent in self._children:
            self._children[parent].discard(block)
            if not self._children[parent]:  # the parent became a leaf, at its own last use
                heapq.heappush(self._leaves, (self._used[parent], parent))

    def clear(self) -> list[int]:
        gone = list(self.parent)
        self.__init__()  # type: ignore[misc]
        return gone
