"""The mocker's KV block manager: refcounts, LRU eviction order, events, clear."""

from __future__ import annotations

import pytest

from core.messages import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent
from workers.engines.mocker.kv import KvBlockManager, KvCacheFull


def fill(kv: KvBlockManager, hashes: list[int], parent: int | None = None) -> None:
    """A request computes the chain ``hashes`` from scratch (after ``parent``)."""
    kv.allocate(len(hashes))
    for h in hashes:
        kv.register(h, parent)
        parent = h


def replay(events: list[KvEvent], held: set[int] | None = None) -> set[int]:
    held = set() if held is None else held
    for ev in events:
        if isinstance(ev, BlockStored):
            held.update(ev.block_hashes)
        elif isinstance(ev, BlockRemoved):
            held.difference_update(ev.block_hashes)
        else:
            held.clear()
    return held


def test_register_emits_one_event_per_chain_run() -> None:
    kv = KvBlockManager(8, 4)
    fill(kv, [1, 2, 3])
    fill(kv, [4], parent=3)
    fill(kv, [10, 11])
    assert kv.take_events() == [
        BlockStored(block_hashes=[1, 2, 3, 4], parent_hash=None),
        BlockStored(block_hashes=[10, 11], parent_hash=None),
    ]
    assert kv.take_events() == []
    assert kv.cached_hashes() == [1, 2, 3, 4, 10, 11]


def test_counts_follow_refcounts() -> None:
    kv = KvBlockManager(8, 4)
    fill(kv, [1, 2])
    kv.allocate(1)  # a partial block
    assert (kv.active_blocks, kv.free, kv.available) == (3, 5, 5)
    kv.acquire([1, 2])  # a second request hits the prefix
    assert kv.active_blocks == 3
    kv.release([1, 2], uncached=1)
    assert (kv.active_blocks, kv.free, kv.available) == (2, 6, 6)
    kv.release([1, 2], uncached=0)
    assert (kv.active_blocks, kv.free, kv.available) == (0, 6, 8)
    assert kv.cached_prefix([1, 2, 3]) == 2
    assert kv.cached_prefix([3, 1]) == 0


def test_free_blocks_go_first_then_lru_tail_of_chain_first() -> None:
    kv = KvBlockManager(4, 4)
    fill(kv, [1, 2])
    kv.release([1, 2], uncached=0)  # evictable: 2 then 1 (the tail goes first)
    fill(kv, [7])
    kv.release([7], uncached=0)  # evictable: 2, 1, 7
    kv.take_events()
    kv.allocate(1)  # the last free block: nothing evicted
    assert kv.take_events() == []
    kv.allocate(2)
    assert kv.take_events() == [BlockRemoved(block_hashes=[2, 1])]
    assert kv.cached_hashes() == [7]


def test_a_reused_block_moves_to_the_back_of_the_lru() -> None:
    kv = KvBlockManager(3, 4)
    fill(kv, [1])
    fill(kv, [2])
    kv.release([1], 0)
    kv.release([2], 0)  # evictable: 1, 2
    kv.acquire([1])
    kv.release([1], 0)  # evictable: 2, 1
    kv.take_events()
    kv.allocate(2)
    assert kv.take_events() == [BlockRemoved(block_hashes=[2])]


def test_referenced_blocks_are_never_evicted() -> None:
    kv = KvBlockManager(3, 4)
    fill(kv, [1, 2])
    assert not kv.can_allocate(2)
    with pytest.raises(KvCacheFull):
        kv.allocate(2)
    assert (kv.free, kv.active_blocks) == (1, 2)  # unchanged


def test_can_allocate_counts_revived_blocks() -> None:
    kv = KvBlockManager(3, 4)
    fill(kv, [1, 2])
    kv.release([1, 2], 0)
    assert kv.can_allocate(3)
    assert kv.can_allocate(1, reusing=[1, 2])
    assert not kv.can_allocate(2, reusing=[1, 2])


def test_registering_a_known_hash_shares_the_block() -> None:
    kv = KvBlockManager(4, 4)
    fill(kv, [1])
    kv.take_events()
    fill(kv, [1])  # a second request computed the same block concurrently
    assert kv.take_events() == []
    assert (kv.active_blocks, kv.free) == (1, 3)
    kv.release([1], 0)
    assert kv.active_blocks == 1
    kv.release([1], 0)
    assert (kv.active_blocks, kv.available) == (0, 4)


def test_clear_keeps_held_blocks_and_reannounces_them() -> None:
    kv = KvBlockManager(8, 4)
    fill(kv, [1, 2, 3])
    fill(kv, [5, 6])
    kv.release([5, 6], 0)
    kv.allocate(1)
    kv.take_events()
    kv.clear()
    events = kv.take_events()
    assert events == [AllBlocksCleared(), BlockStored(block_hashes=[1, 2, 3], parent_hash=None)]
    assert kv.cached_hashes() == [1, 2, 3]
    assert (kv.active_blocks, kv.free, kv.available) == (4, 4, 4)


def test_events_replay_to_the_cache_contents() -> None:
    kv = KvBlockManager(5, 4)
    seen: set[int] = set()
    fill(kv, [1, 2, 3])
    kv.release([1, 2, 3], 0)
    fill(kv, [4, 5, 6])  # evicts 3
    replay(kv.take_events(), seen)
    assert seen == set(kv.cached_hashes()) == {1, 2, 4, 5, 6}
    kv.release([4, 5, 6], 0)
    kv.acquire([1])
    kv.clear()
    replay(kv.take_events(), seen)
    assert seen == set(kv.cached_hashes()) == {1}
