"""The prefix-closure checker the conformance suite applies to every engine's KV events must be able
to fail: hand-built event sequences, closed and not."""

from __future__ import annotations

import pytest

from core.messages import AllBlocksCleared, BlockRemoved, BlockStored
from tests.support.kv_events import PrefixClosureChecker, PrefixClosureViolation


def test_a_chain_evicted_from_its_tail_stays_closed() -> None:
    checker = PrefixClosureChecker()
    checker.apply([BlockStored([1, 2, 3])])
    checker.apply([BlockStored([4], parent_hash=2)])  # a branch off the shared prefix
    checker.apply([BlockRemoved([3, 4]), BlockRemoved([2])])
    checker.apply([BlockRemoved([1]), BlockStored([7, 8])])
    assert checker.held == {7: None, 8: 7}
    assert (checker.stored, checker.removed, checker.batches_checked) == (6, 4, 4)


def test_evicting_a_parent_before_its_child_is_rejected() -> None:
    checker = PrefixClosureChecker()
    checker.apply([BlockStored([1, 2, 3])])
    with pytest.raises(PrefixClosureViolation, match="0x3 \\(parent 0x2\\)"):
        checker.apply([BlockRemoved([2])])


def test_a_block_stored_under_a_parent_never_held_is_rejected() -> None:
    with pytest.raises(PrefixClosureViolation, match="1 held block"):
        PrefixClosureChecker().replay([[BlockStored([1])], [BlockStored([5, 6], parent_hash=9)]])


def test_a_clear_drops_the_children_with_the_parents() -> None:
    checker = PrefixClosureChecker()
    checker.apply([BlockStored([1, 2])])
    with pytest.raises(PrefixClosureViolation):
        checker.apply([AllBlocksCleared(), BlockStored([2], parent_hash=1)])


def test_the_check_is_per_batch() -> None:
    """Inside one batch the order of a removal and the store that repairs it does not matter: the
    index applies a batch atomically."""
    checker = PrefixClosureChecker()
    checker.apply([BlockStored([1, 2])])
    checker.apply([BlockRemoved([1]), BlockStored([1])])
    assert checker.orphans() == []
