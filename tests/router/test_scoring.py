"""Overlaps read from the index's bitmaps (router.scoring), and the tests' oracle of the cost and the
pick (tests/router/cost_oracle.py): exact values."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest

from router.scoring import leading_overlaps, prompt_blocks
from tests.router.cost_oracle import cost_terms, evaluate, kv_costs, pick_index, softmax_probabilities


def _bitmap(slots: set[int], width: int) -> bytes:
    row = bytearray(width)
    for s in slots:
        row[s // 8] |= 0x80 >> (s % 8)
    return bytes(row)


def test_leading_overlaps_counts_the_leading_run_only() -> None:
    rows = [_bitmap(s, 2) for s in ({0, 3, 9}, {0, 9}, {0, 3, 9}, {9})]
    got = leading_overlaps(rows, [0, 3, 9, 5])
    # slot 3 holds block 2 but not block 1: only its leading run (1 block) counts.
    assert got.tolist() == [3, 1, 4, 0]


def test_leading_overlaps_redis_bit_order() -> None:
    # SETBIT key 1 1 sets 0b0100_0000 in byte 0; SETBIT key 8 1 sets 0x80 in byte 1.
    assert leading_overlaps([bytes([0x40, 0x80])], [0, 1, 8]).tolist() == [0, 1, 1]


def test_leading_overlaps_reads_past_the_end_as_zero() -> None:
    # Redis stores a bitmap only up to its highest set bit's byte: rows differ in length.
    rows = [_bitmap({0, 20}, 3), _bitmap({0}, 1), _bitmap({0, 20}, 3)]
    assert leading_overlaps(rows, [0, 20, 100]).tolist() == [3, 1, 0]


def test_leading_overlaps_empty() -> None:
    assert leading_overlaps([], [1, 2]).tolist() == [0, 0]
    assert leading_overlaps([b"\xff"], []).tolist() == []


def test_prompt_blocks_counts_the_partial_block() -> None:
    assert [prompt_blocks(n, 16) for n in (0, 1, 16, 17, 32)] == [0, 1, 1, 2, 2]


def test_kv_costs_formula() -> None:
    # cost = weight * (prompt - overlap + queued) + max(active, predicted)
    costs = kv_costs(prompt=[10, 10, 10], overlap=[8, 0, 4], queued_prefill=[0, 0, 5], active=[30, 0, 7],
                     predicted=[12, 3, 9], block_sizes=[16, 16, 16], weight=2.0)
    assert costs.tolist() == [2 * 2 + 30, 2 * 10 + 3, 2 * 11 + 9]


def test_kv_costs_scales_to_the_smallest_block_size() -> None:
    # 320 tokens: 20 blocks of 16 or 10 blocks of 32; the 32-token worker's blocks count double.
    costs = kv_costs(prompt=[20, 10], overlap=[0, 5], queued_prefill=[0, 0], active=[4, 2], predicted=[0, 0],
                     block_sizes=[16, 32], weight=1.0)
    assert costs.tolist() == [20 + 4, 2 * (5 + 2)]


def test_weight_zero_is_pure_load() -> None:
    costs = kv_costs([10, 10], [10, 0], [0, 0], [5, 3], [0, 0], [16, 16], weight=0.0)
    assert costs.tolist() == [5, 3]


def test_pick_min_and_ties_by_u() -> None:
    assert pick_index([3.0, 1.0, 2.0], 0.0, 0.99) == 1
    # ties at 0, 2, 3: u picks the floor(u × 3)-th of them
    assert [pick_index([1.0, 5.0, 1.0, 1.0], 0.0, u) for u in (0.0, 0.33, 0.34, 0.66, 0.67, 0.999)] == [0, 0, 2, 2, 3, 3]


def test_random_u_breaks_ties_uniformly() -> None:
    rng = random.Random(1)
    picks = Counter(pick_index([1.0, 5.0, 1.0, 1.0], 0.0, rng.random()) for _ in range(3000))
    assert set(picks) == {0, 2, 3}
    assert all(900 < n < 1100 for n in picks.values())


def test_pick_softmax_by_u() -> None:
    costs = [0.0, 1.0, 3.0]
    probs = softmax_probabilities(costs, 1.0)
    expected = np.exp([0.0, -1.0, -3.0]) / np.exp([0.0, -1.0, -3.0]).sum()
    assert probs == pytest.approx(expected)
    edges = np.cumsum(expected)  # u below the first edge picks 0, and so on
    assert pick_index(costs, 1.0, 0.0) == 0
    assert pick_index(costs, 1.0, edges[0] - 1e-9) == 0
    assert pick_index(costs, 1.0, edges[0] + 1e-9) == 1
    assert pick_index(costs, 1.0, edges[1] + 1e-9) == 2
    assert pick_index(costs, 1.0, 0.999999) == 2
    rng = random.Random(7)
    n = 20000
    picks = Counter(pick_index(costs, 1.0, rng.random()) for _ in range(n))
    for i, p in enumerate(expected):
        assert picks[i] / n == pytest.approx(p, abs=0.015)


def test_pick_softmax_is_shift_invariant_and_stable() -> None:
    assert softmax_probabilities([1e6, 1e6 + 1], 1.0) == pytest.approx(softmax_probabilities([0, 1], 1.0))
    assert pick_index([5000.0, 0.0], 1.0, 0.5) == 1


def test_cost_terms_decompose_the_cost() -> None:
    terms = cost_terms([10, 20], [4, 0], [7, 1], [16, 32], weight=2.0)
    assert terms.static.tolist() == [12.0, 80.0]  # scale × weight × (prompt − overlap)
    assert terms.queued_weight.tolist() == [2.0, 4.0]
    assert terms.decode_weight.tolist() == [1.0, 2.0]
    assert evaluate(terms, [3, 0], [9, 0]).tolist() == [12 + 2 * 3 + 9, 80 + 0 + 2 * 1]


def test_pick_needs_costs() -> None:
    with pytest.raises(ValueError):
        pick_index([], 0.0, 0.5)


def test_leading_overlaps_matches_a_plain_loop() -> None:
    rng = random.Random(5)
    for _ in range(200):
        n_slots = rng.choice([3, 9, 64, 130])
        rows = []
        holders = set(range(n_slots))
        for _ in range(rng.randrange(1, 40)):
            holders = {s for s in holders if rng.random() > 0.1} | {rng.randrange(n_slots) for _ in range(2)}
            top = max(holders | {0})
            rows.append(_bitmap(holders, top // 8 + 1 + rng.randrange(2)))
        slots = rng.sample(range(n_slots + 8), k=min(20, n_slots))

        def naive(slot: int, rows: list[bytes] = rows) -> int:
            count = 0
            for row in rows:
                if slot // 8 >= len(row) or not row[slot // 8] & (0x80 >> (slot % 8)):
                    break
                count += 1
            return count

        assert leading_overlaps(rows, slots).tolist() == [naive(s) for s in slots]


def test_leading_overlaps_long_runs_of_equal_bitmaps() -> None:
    # Distinct bytes objects with equal contents (as Redis replies are), runs of identical rows.
    rows = [bytes(_bitmap({0, 3, 9}, 2)) for _ in range(300)] + [bytes(_bitmap({3, 9}, 2)) for _ in range(200)] \
        + [bytes(_bitmap({9}, 3)) for _ in range(5)]
    assert leading_overlaps(rows, [0, 3, 9, 5, 40]).tolist() == [300, 500, 505, 0, 0]
