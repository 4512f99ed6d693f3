"""The mocker's paged KV cache: a fixed pool of blocks, a prefix cache and its events. Pure, no I/O.

A block holds ``block_size`` tokens. A block in use is either *uncached* (still filling, or
full but not yet registered) or *cached*: full and named by its Sluice chained block hash
(``router.hashing``), so later requests with the same prefix can reuse it. Every block is in
exactly one of three places:

* the free list (uncached, unused): ``free``;
* the cache (``hash -> refcount``): in use by ``refcount`` requests, or, with refcount 0,
  *evictable*, kept in an LRU list until its slot is needed;
* held uncached by a request: ``uncached_in_use``.

So ``num_blocks == free + uncached_in_use + len(cache)``, and the blocks running requests need
(``active_blocks``) are the uncached ones in use plus the cached ones with a reference.

Allocation takes free blocks first and only then evicts, oldest first. Requests release their
blocks last block first, so the tail of a chain becomes evictable before its head: a prefix
shared by many requests outlives the suffixes that only one of them had (vLLM frees in the same
order, for the same reason).

Events: registering a block appends :class:`BlockStored` (consecutive blocks of one chain merge
into one event), evicting appends :class:`BlockRemoved`, :meth:`clear` appends
:class:`AllBlocksCleared`. The owner drains them with :meth:`take_events`; replaying them from the
start always gives :meth:`cached_hashes`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from core.messages import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent


class KvCacheFull(RuntimeError):
    """An allocation asked for more blocks than are free or evictable."""


class KvBlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free = num_blocks
        self.uncached_in_use = 0
        self._refs: dict[int, int] = {}
        self._parents: dict[int, int | None] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self._events: list[KvEvent] = []

    # ---- queries ------------------------------------------------------------------------------
    @property
    def active_blocks(self) -> int:
        """Blocks referenced by at least one request (shared blocks count once)."""
        return self.uncached_in_use + len(self._refs) - len(self._evictable)

    @property
    def available(self) -> int:
        """Blocks an allocation can get: free ones plus evictable cached ones."""
        return self.free + len(self._evictable)

    @property
    def cached_count(self) -> int:
        """How many blocks are in the prefix cache (in use or evictable)."""
        return len(self._refs)

    def cached_hashes(self) -> list[int]:
        """Every block hash in the prefix cache, in the order the blocks were registered."""
        return list(self._refs)

    def cached_prefix(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of a chain are in the cache."""
        n = 0
        for h in hashes:
            if h not in self._refs:
                break
            n += 1
        return n

    def can_allocate(self, new_blocks: int, reusing: Sequence[int] = ()) -> bool:
        """Whether ``new_blocks`` uncached blocks can be allocated after acquiring the cached
        blocks ``reusing`` (acquiring an evictable block takes it off the LRU list)."""
        revived = sum(1 for h in reusing if h in self._evictable)
        return new_blocks <= self.available - revived

    # ---- changes ------------------------------------------------------------------------------
    def acquire(self, hashes: Sequence[int]) -> None:
        """Take a reference on cached blocks (a prefix-cache hit); they stop being evictable."""
        for h in hashes:
            refs = self._refs[h]
            if refs == 0:
                del self._evictable[h]
            self._refs[h] = refs + 1

    def allocate(self, n: int) -> None:
        """Take ``n`` uncached blocks, evicting the least recently released cached blocks when
        the free list runs out. Raises :class:`KvCacheFull` (changing nothing) if they do not fit."""
        if n <= 0:
            return
        if n > self.available:
            raise KvCacheFull(f"need {n} KV blocks, {self.available} available")
        short = n - self.free
        if short > 0:
            removed = []
            for _ in range(short):
                h, _unused = self._evictable.popitem(last=False)
                del self._refs[h]
                del self._parents[h]
                removed.append(h)
            self.free += short
            self._append_removed(removed)
        self.free -= n
        self.uncached_in_use += n

    def register(self, block_hash: int, parent: int | None) -> None:
        """One uncached block a request holds became full: it enters the cache as ``block_hash``
        (child of ``parent``, None at the root), still referenced by that request.

        If another request registered the same hash meanwhile, the request takes a reference on
        that block instead and its own copy goes back to the free list (no event: the cache did
        not change)."""
        if self.uncached_in_use <= 0:
            raise RuntimeError("register without an uncached block in use")
        self.uncached_in_use -= 1
        if block_hash in self._refs:
            self.free += 1
            self.acquire((block_hash,))
            return
        self._refs[block_hash] = 1
        self._parents[block_hash] = parent
        self._append_stored(block_hash, parent)

    def release(self, hashes: Sequence[int], uncached: int) -> None:
        """Drop a request's references: its cached blocks ``hashes`` (chain order) and its
        ``uncached`` blocks. Cached blocks whose count reaches 0 become evictable, the chain's
        tail first; uncached blocks go back to the free list."""
        if uncached > self.uncached_in_use:
            raise RuntimeError("releasing more uncached blocks than are in use")
        for h in reversed(hashes):
            refs = self._refs[h] - 1
            self._refs[h] = refs
            if refs == 0:
                self._evictable[h] = None
        self.uncached_in_use -= uncached
        self.free += uncached

    def clear(self) -> None:
        """Drop every cached block no request uses.

        Emits :class:`AllBlocksCleared`, then one :class:`BlockStored` per chain for the cached
        blocks that running requests still hold (they stay cached: their requests need them), so
        that a router replaying the events holds exactly :meth:`cached_hashes`."""
        for h in self._evictable:
            del self._refs[h]
            del self._parents[h]
        self.free += len(self._evictable)
        self._evictable.clear()
        self._events.append(AllBlocksCleared())
        for h in self._refs:
            self._append_stored(h, self._parents[h])

    def take_events(self) -> list[KvEvent]:
        """The events since the last call, in order."""
        events, self._events = self._events, []
        return events

    # ---- events -------------------------------------------------------------------------------
    # Pending events are private until take_events hands them out, so extending the last one's
    # list (merging a run of blocks into one event) changes nothing anyone has seen.
    def _append_stored(self, block_hash: int, parent: int | None) -> None:
        last = self._events[-1] if self._events else None
        if isinstance(last, BlockStored) and parent is not None and last.block_hashes[-1] == parent:
            last.block_hashes.append(block_hash)
        else:
            self._events.append(BlockStored(block_hashes=[block_hash], parent_hash=parent))

    def _append_removed(self, hashes: list[int]) -> None:
        last = self._events[-1] if self._events else None
        if isinstance(last, BlockRemoved):
            last.block_hashes.extend(hashes)
        else:
            self._events.append(BlockRemoved(block_hashes=hashes))
