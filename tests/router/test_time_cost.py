"""The ``time`` cost: each worker's predicted time to first token, from its own step-time model."""

from __future__ import annotations

import pytest

from router.time_cost import DEFAULT_TIMING, TimeWeights, timing_columns
from tests.router.cost_oracle import time_costs
from workers.engines.mocker.timing import decode_ms, prefill_ms

NO_EXTRAS = TimeWeights(slowdown=0.0, eviction=0.0)


def cols(n: int, *, budget: int = 8192, kv_blocks: int = 1000, running: int = 0, block_size: int = 16,
         timing: tuple[float, ...] | None = None):  # type: ignore[no-untyped-def]
    return timing_columns([timing] * n, [budget] * n, [kv_blocks] * n, [running] * n, [block_size] * n)


def test_an_idle_worker_predicts_the_uncached_prefill() -> None:
    # 100 blocks of 16, 60 cached: 640 tokens to compute in one step, nothing decoding.
    [cost] = time_costs([100], [60], [0], [0], [0], cols(1), NO_EXTRAS)
    assert cost == pytest.approx(prefill_ms(640))


def test_queued_prefill_and_running_decodes_come_first() -> None:
    # 10 queued blocks ahead, 20 blocks decoding of 1000: both in one step, which also decodes.
    [cost] = time_costs([100], [60], [10], [20], [0], cols(1), NO_EXTRAS)
    dec = decode_ms(0.02)
    assert cost == pytest.approx(prefill_ms(800) + dec + dec / 2)


def test_a_long_prefill_takes_several_steps_of_the_budget() -> None:
    [cost] = time_costs([100], [0], [0], [0], [0], cols(1, budget=512), NO_EXTRAS)
    assert cost == pytest.approx(3 * prefill_ms(512) + prefill_ms(1600 - 3 * 512))


def test_the_cache_hit_wins_until_the_queue_in_front_of_it_costs_more() -> None:
    # w0 holds 90 of 100 blocks; w1 nothing. Idle, w0 wins; with 200 blocks of prefill queued, w1 does.
    assert time_costs([100, 100], [90, 0], [0, 0], [0, 0], [0, 0], cols(2), NO_EXTRAS).argmin() == 0
    assert time_costs([100, 100], [90, 0], [200, 0], [0, 0], [0, 0], cols(2), NO_EXTRAS).argmin() == 1


def test_slowdown_and_eviction_weigh_in() -> None:
    base = time_costs([100], [60], [0], [0], [0], cols(1, running=4), NO_EXTRAS)[0]
    slowed = time_costs([100], [60], [0], [0], [0], cols(1, running=4), TimeWeights(0.5, 0.0))[0]
    assert slowed == pytest.approx(base + 0.5 * 4 * prefill_ms(640))
    # 40 uncached blocks into a cache of 50 with 30 busy: 20 evicted, each worth 16 tokens at p1.
    full = time_costs([100], [60], [0], [30], [0], cols(1, kv_blocks=50), TimeWeights(0.0, 0.5))[0]
    plain = time_costs([100], [60], [0], [30], [0], cols(1, kv_blocks=50), NO_EXTRAS)[0]
    assert full == pytest.approx(plain + 0.5 * 20 * 16 * DEFAULT_TIMING[1])


def test_each_worker_is_predicted_with_its_own_model() -> None:
    fast = (1.0, 0.001, 0.0, 1.0, 0.0, 0.0)
    both = timing_columns([None, fast], [8192, 8192], [1000, 1000], [0, 0], [16, 16])
    costs = time_costs([100, 100], [0, 0], [0, 0], [0, 0], [0, 0], both, NO_EXTRAS)
    assert costs[0] == pytest.approx(prefill_ms(1600)) and costs[1] == pytest.approx(1.0 + 1.6)


def test_on_a_full_cache_every_computed_block_evicts_one() -> None:
    # 40 uncached blocks on a worker whose 1,000 blocks all hold cached content: all 40 push one out;
    # with 960 of them cached, 40 are free and nothing is pushed out.
    full = timing_columns([None], [8192], [1000], [0], [16], [1000])
    roomy = timing_columns([None], [8192], [1000], [0], [16], [960])
    weights = TimeWeights(0.0, 1.0)
    plain = time_costs([100], [60], [0], [0], [0], full, NO_EXTRAS)[0]
    assert time_costs([100], [60], [0], [0], [0], full, weights)[0] == pytest.approx(plain + 40 * 16 * DEFAULT_TIMING[1])
    assert time_costs([100], [60], [0], [0], [0], roomy, weights)[0] == pytest.approx(plain)



def test_blocks_onboarded_from_a_kv_tier_evict_as_computed_ones_do() -> None:
    # 100 blocks, 60 on the device and 30 more in a tier (credited: 90), into a cache of 1,000 blocks
    # all holding cached content: the 40 new blocks push 40 out, whether onboarded or computed.
    full = timing_columns([None], [8192], [1000], [0], [16], [1000])
    weights = TimeWeights(0.0, 1.0)
    plain = time_costs([100], [90], [0], [0], [0], full, NO_EXTRAS, device_overlap=[60])[0]
    assert time_costs([100], [90], [0], [0], [0], full, weights, device_overlap=[60])[0] == pytest.approx(
        plain + 40 * 16 * DEFAULT_TIMING[1])
