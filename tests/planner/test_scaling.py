"""Bounds, hysteresis and the budget (planner.scaling)."""

from __future__ import annotations

from core.pools import Pool
from planner.scaling import (
    PoolMemory,
    Wish,
    bounded,
    decode_wish,
    fit_budget,
    floor_allowed,
    grow_only,
    lowest,
    settle,
    wish_within,
    within_band,
)


def test_bounds() -> None:
    assert [bounded(n, 1, 4) for n in (0, 1, 3, 9)] == [1, 1, 3, 4]


def test_only_a_prefill_pool_whose_prompts_the_decode_pool_may_compute_goes_under_the_minimum() -> None:
    assert lowest(Pool.PREFILL, 1, local_prefill=True) == 0
    assert [lowest(p, 1, local_prefill=True) for p in (Pool.DECODE, Pool.AGG)] == [1, 1]
    assert [lowest(p, 2, local_prefill=False) for p in (Pool.PREFILL, Pool.DECODE, Pool.AGG)] == [2, 2, 2]


def test_growing_is_immediate_and_resets_the_wish_to_shrink() -> None:
    m = PoolMemory(low=[1])
    assert settle(2, 5, m, tick=7, down_after=2, cooldown=2) == (5, "up")
    assert m.last_up == 7 and m.low == []


def test_shrinking_waits_for_enough_intervals_then_takes_the_most_of_their_wishes() -> None:
    m = PoolMemory()
    assert settle(4, 2, m, tick=10, down_after=2, cooldown=0) == (4, "hold: 1 of 2 intervals wanted fewer")
    assert settle(4, 3, m, tick=11, down_after=2, cooldown=0) == (3, "down")
    assert m.low == []


def test_a_steady_interval_between_low_ones_starts_the_count_again() -> None:
    m = PoolMemory()
    settle(4, 2, m, tick=1, down_after=2, cooldown=0)
    assert settle(4, 4, m, tick=2, down_after=2, cooldown=0) == (4, "hold")
    assert settle(4, 2, m, tick=3, down_after=2, cooldown=0)[0] == 4


def test_no_shrinking_within_the_cooldown_of_growing() -> None:
    m = PoolMemory()
    settle(2, 4, m, tick=5, down_after=1, cooldown=2)
    assert settle(4, 2, m, tick=6, down_after=1, cooldown=2)[0] == 4
    assert settle(4, 2, m, tick=7, down_after=1, cooldown=2)[0] == 4
    assert settle(4, 2, m, tick=8, down_after=1, cooldown=2) == (2, "down")


def test_a_sure_fall_shrinks_at_once_to_what_the_upper_end_of_the_rate_needs() -> None:
    m = PoolMemory()
    # The plan wants 3 of 8, and even the rate's upper end needs only 5: no waiting for a second interval.
    assert settle(8, 3, m, tick=10, down_after=2, cooldown=2, sure=5) == (5, "down (a sure fall)")
    assert (m.last_down, m.shrunk_from, m.low) == (10, 8, [])


def test_a_fall_within_the_noise_waits_for_the_hysteresis() -> None:
    m = PoolMemory()
    # The upper end of the rate still needs the 4 the pool has: an unlucky interval, not a fall.
    assert settle(4, 3, m, tick=10, down_after=2, cooldown=2, sure=4) == (4, "hold: 1 of 2 intervals wanted fewer")
    assert settle(4, 3, m, tick=11, down_after=2, cooldown=2, sure=4) == (3, "down")


def test_a_sure_fall_waits_for_the_cooldown_of_growing() -> None:
    m = PoolMemory()
    settle(2, 6, m, tick=5, down_after=2, cooldown=2)
    assert settle(6, 2, m, tick=7, down_after=2, cooldown=2, sure=3)[0] == 6
    assert settle(6, 2, m, tick=8, down_after=2, cooldown=2, sure=3) == (3, "down (a sure fall)")


def test_the_floor_grows_a_pool_back_only_past_its_size_within_the_cooldown_of_shrinking_it() -> None:
    m = PoolMemory()
    assert floor_allowed(m, tick=1, cooldown=2, floor=2)
    settle(4, 2, m, tick=5, down_after=1, cooldown=2)
    assert (m.last_down, m.shrunk_from) == (5, 4)
    assert [floor_allowed(m, tick=t, cooldown=2, floor=4) for t in (5, 6, 7, 8)] == [False, False, False, True]
    assert floor_allowed(m, tick=6, cooldown=2, floor=5)  # more than it had: a ramp, not a flap


def test_the_fast_path_only_grows() -> None:
    m = PoolMemory(low=[1])
    assert grow_only(3, 1, m, tick=4) == (3, "hold")
    assert m.low == [1]
    assert grow_only(3, 6, m, tick=4) == (6, "up (burst)")
    assert m.last_up == 4 and m.low == []


def test_the_budget_keeps_floors_and_shares_the_rest_in_proportion() -> None:
    assert fit_budget({"a": 2, "b": 3}, {"a": 1, "b": 1}, 10) == {"a": 2, "b": 3}
    # 10 wanted, budget 6: floors 1+1, then 4 shared 3:5 over what each wanted above its floor.
    assert fit_budget({"a": 4, "b": 6}, {"a": 1, "b": 1}, 6) == {"a": 3, "b": 3}
    assert sum(fit_budget({"a": 7, "b": 5, "c": 3}, {"a": 1, "b": 1, "c": 1}, 8).values()) == 8
    # Floors alone past the budget: kept (the bounds forbid less).
    assert fit_budget({"a": 3, "b": 3}, {"a": 2, "b": 2}, 3) == {"a": 2, "b": 2}


def test_moving_the_prompts_between_the_pools_is_one_move() -> None:
    plan, apart = Wish(6), Wish(5, sure=5)
    # The plan moves the prompts to the decode pool (6 workers alone against 5 apart), but the prefill
    # pool's hysteresis keeps its 2 workers: the decode pool keeps its size apart, not 6 beside them.
    assert decode_wish(2, 2, plan, apart) == Wish(5, sure=5, apart=True)
    # Once the prefill pool goes to 0, the decode pool takes the prompts: its plan.
    assert decode_wish(2, 0, plan, apart) == plan
    assert decode_wish(0, 0, plan, apart) == plan
    # The prefill pool grows from 0: the prompts leave the decode pool, which shrinks to its plan at once.
    moved = decode_wish(0, 1, Wish(3), None)
    assert (moved.wanted, moved.sure, moved.apart) == (3, 3, False)
    m = PoolMemory()
    assert settle(7, moved.wanted, m, tick=4, down_after=2, cooldown=2, sure=moved.sure, sure_why=moved.sure_why) == (
        3, "down (the prefill pool grows from 0 to 1)")
    # The pools stay apart and the prefill pool had workers: the plan as it is.
    assert decode_wish(1, 2, Wish(3, sure=2), None) == Wish(3, sure=2)


def test_a_need_within_the_up_band_holds_the_pool_instead_of_growing_it() -> None:
    # A plan that rounds 5.2 workers up to 6 holds a pool of 5 within a band of 5% (up to 5.25) ...
    memory = PoolMemory(low=[4])
    assert settle(5, 6, memory, 10, 2, 2, need=5.2, up_band=0.05) == (
        5, "hold: needs 5.20 workers, within 5% of the 5 it has")
    assert memory.low == [] and memory.last_up < 0  # a hold: neither a wish to shrink nor a growth
    # ... and grows it past the band, on a whole number (the floor, a sure rise) or with no band.
    assert settle(5, 6, PoolMemory(), 10, 2, 2, need=5.3, up_band=0.05) == (6, "up")
    assert settle(5, 6, PoolMemory(), 10, 2, 2, need=None, up_band=0.05) == (6, "up")
    assert settle(5, 6, PoolMemory(), 10, 2, 2, need=5.2, up_band=0.0) == (6, "up")
    # A pool of no worker grows on any need; the band never shrinks a pool.
    assert settle(0, 1, PoolMemory(), 10, 2, 2, need=0.01, up_band=0.05) == (1, "up")
    assert [within_band(n, need, 0.05) for n, need in ((5, 5.25), (5, 5.26), (0, 0.0), (2, None))] == [
        True, False, False, False]


def test_a_wish_within_the_bounds_keeps_its_need_only_where_the_bounds_kept_its_size() -> None:
    assert wish_within(3, 9, 2.4, 1, 8) == Wish(3, 8, need=2.4)
    assert wish_within(0, None, 0.3, 1, 8) == Wish(1, None, need=None)  # the minimum is a whole number
    assert wish_within(10, None, 9.5, 1, 8) == Wish(8, None, need=None)
