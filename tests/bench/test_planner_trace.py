"""The planner bench's day and its offline sizings (bench.planner_trace), as pure functions."""

from __future__ import annotations

import pytest

from bench.planner_trace import (
    DAY,
    Arrival,
    Schedule,
    Step,
    action_times,
    actions_of,
    arrivals,
    causal,
    cpu_by_step,
    day_slice,
    fixed,
    fixed_sizes,
    flaps,
    oracle,
    realized_rates,
    short_share,
    sized,
    steady_intervals,
)
from planner.modes import SlaPlanner
from planner.profile import DecodePoint, PrefillPoint, Profile


def sla() -> SlaPlanner:
    profile = Profile(engine="mocker", model="m", kv_tokens=100_000, max_num_seqs=64,
                      prefill=[PrefillPoint(isl=500, ttft_s=0.05), PrefillPoint(isl=2000, ttft_s=0.2)],
                      decode=[DecodePoint(batch=1, context=500, itl_s=0.01), DecodePoint(batch=64, context=500, itl_s=0.2),
                              DecodePoint(batch=1, context=2000, itl_s=0.02), DecodePoint(batch=64, context=2000, itl_s=0.4)])
    return SlaPlanner(profile, 1.2, 0.08, 0.7)


def test_arrivals_are_seeded_and_realized_rates_count_them() -> None:
    plan = arrivals(DAY, 0.6, 8.0, seed=7)
    assert plan == arrivals(DAY, 0.6, 8.0, seed=7) and plan != arrivals(DAY, 0.6, 8.0, seed=8)
    rates = realized_rates(plan, len(DAY), 8.0)
    assert sum(r * 8.0 for r in rates) == pytest.approx(len(plan))
    assert all(a.step * 8.0 <= a.at_s < (a.step + 1) * 8.0 for a in plan)


def test_the_oracle_sizes_each_step_on_its_trace_mean() -> None:
    day = [Step(1.0, 512, 128), Step(8.0, 512, 128), Step(1.0, 512, 128)]
    ref = oracle(day, 0.6, sla(), "agg", 1, 8)
    assert ref.replicas == sized(day, [0.6, 4.8, 0.6], sla(), "agg", 1, 8, "x").replicas
    assert ref.replicas["agg"][1] > ref.replicas["agg"][0] == ref.replicas["agg"][2]


def test_causal_sizing_lags_one_step_and_its_hysteresis_shrinks_late() -> None:
    day = [Step(1.0, 512, 128)] * 2 + [Step(8.0, 512, 128)] * 3 + [Step(1.0, 512, 128)] * 5
    rates = [0.6 * s.load for s in day]
    need = sized(day, rates, sla(), "agg", 1, 8, "need")
    lagging = causal(day, rates, sla(), "agg", 1, 8, z=0.0, step_s=8.0, down_after=1, cooldown=0)
    # No hysteresis, no headroom: step i has what step i - 1 needed.
    assert lagging.replicas["agg"][1:] == need.replicas["agg"][:-1]
    held = causal(day, rates, sla(), "agg", 1, 8, z=0.0, step_s=8.0, down_after=2, cooldown=2)
    peak = max(need.replicas["agg"])
    # It grows with the lag, then shrinks at the second interval that wants fewer: one interval later.
    assert held.replicas["agg"][:6] == lagging.replicas["agg"][:6]
    assert lagging.replicas["agg"][6] < peak == held.replicas["agg"][6] and held.replicas["agg"][7] < peak
    assert held.worker_seconds(8.0) > lagging.worker_seconds(8.0)
    # Headroom only adds workers.
    raised = causal(day, rates, sla(), "agg", 1, 8, z=1.3, step_s=8.0, down_after=2, cooldown=2)
    assert all(r >= h for r, h in zip(raised.replicas["agg"], held.replicas["agg"], strict=True))


def test_causal_sizing_takes_its_forecast_from_the_predictor_it_is_given() -> None:
    day = [Step(1.0, 512, 128)] * 3 + [Step(1.0 + k, 512, 128) for k in range(1, 7)] + [Step(7.0, 512, 128)] * 3
    rates = [0.6 * s.load for s in day]
    lagging = causal(day, rates, sla(), "agg", 1, 8, z=0.0, step_s=60.0, down_after=1, cooldown=0)
    constant = causal(day, rates, sla(), "agg", 1, 8, z=0.0, step_s=60.0, down_after=1, cooldown=0,
                      predictor="constant")
    assert constant.replicas == lagging.replicas  # the default is the last interval's rate
    trend = causal(day, rates, sla(), "agg", 1, 8, z=0.0, step_s=60.0, down_after=1, cooldown=0,
                   predictor="kalman")
    # On a steady ramp a trend predictor sees the next step coming: never fewer workers, some step more.
    ramp = range(5, 10)
    assert all(trend.replicas["agg"][i] >= constant.replicas["agg"][i] for i in ramp)
    assert any(trend.replicas["agg"][i] > constant.replicas["agg"][i] for i in ramp)


def test_short_share_counts_the_requests_of_steps_sized_below_the_need() -> None:
    need = Schedule("need", {"prefill": [1, 1, 2], "decode": [1, 3, 3]})
    have = Schedule("have", {"prefill": [1, 1, 1], "decode": [1, 2, 3]})
    plan = [Arrival(0.0, 0, 1, 1), Arrival(1.0, 1, 1, 1), Arrival(2.0, 1, 1, 1), Arrival(3.0, 2, 1, 1)]
    assert short_share(have, need, plan) == pytest.approx(3 / 4)
    assert short_share(need, need, plan) == 0.0


def test_a_fast_action_is_timed_within_its_interval_and_answers_the_step_under_way() -> None:
    decisions = [(0, "fast", 115.0), (1, "interval", 160.0), (6, "interval", 460.0), (6, "fast", 508.0),
                 (7, "interval", 520.0), (7, "fast", 568.0)]
    assert action_times(decisions, 60.0) == [0.25, 1.0, 6.0, 6.8, 7.0, 7.8]
    steady = steady_intervals(DAY)  # the night: intervals 1-7 end its steps 0-6; step 7 starts the ramp
    # The night's last shrink at tick 7, then a fast growth 0.8 interval later, on the ramp: not a flap.
    assert flaps([(7.0, "agg", "down"), (7.8, "agg", "up")], 2, steady) == 0
    # The same a tick earlier is a flap: the growth answered the night's last step.
    assert flaps([(6.0, "agg", "down"), (6.8, "agg", "up")], 2, steady) == 1
    # A fast growth, then a shrink 2.8 intervals later: not within two.
    assert flaps([(3.2, "agg", "up"), (6.0, "agg", "down")], 2, steady) == 0


def test_flaps_count_reversals_within_the_window_on_steady_steps() -> None:
    actions = [(3, "agg", "up"), (4, "agg", "down"), (9, "agg", "up"), (10, "decode", "down"), (11, "decode", "up")]
    assert flaps(actions, 2, steady={4, 11}) == 2
    assert flaps(actions, 2, steady={9}) == 0  # 9 is 5 intervals after 4


def test_a_schedules_actions_are_numbered_as_the_planners_intervals() -> None:
    s = Schedule("s", {"agg": [1, 2, 2, 1], "decode": [3, 3, 3, 3]})
    # Interval 1 sizes step 1 (up to 2), interval 3 sizes step 3 (down to 1).
    assert actions_of(s) == [(1, "agg", "up"), (3, "agg", "down")]


def test_the_machines_cpu_is_averaged_per_step_and_a_sample_counts_for_the_second_before_it() -> None:
    # Steps of 10 s from t0 = 100: the sample at 110.2 covers 109.2-110.2, mostly step 0.
    cpu = [(99.0, 1.0), (101.0, 0.2), (105.0, 0.4), (110.2, 0.6), (111.0, 0.9), (125.0, 0.5), (140.0, 1.0)]
    assert cpu_by_step(cpu, 100.0, 10.0, 3) == [0.4, 0.9, 0.5]


def test_a_fixed_fleet_is_named_by_its_sizes_per_pool() -> None:
    assert fixed_sizes("static-7", ["agg"]) == {"agg": 7}
    assert fixed_sizes("static-2+5", ["prefill", "decode"]) == {"prefill": 2, "decode": 5}
    for other in ("static-peak", "static-mean", "static-0", "static-2+5", "oracle"):
        assert fixed_sizes(other, ["agg"]) is None
    assert fixed(fixed_sizes("static-2+5", ["prefill", "decode"]) or {}, 3).replicas == {"prefill": [2, 2, 2],
                                                                                            "decode": [5, 5, 5]}


def test_a_slice_of_the_day_keeps_the_days_draw_and_counts_time_from_its_first_step() -> None:
    day = arrivals(DAY, 0.6, 10.0, seed=3)
    part = day_slice(day, 11, 15, 10.0)
    assert [(a.step, a.isl) for a in part] == [(a.step, a.isl) for a in day if 11 <= a.step < 15]
    assert all(0 <= a.at_s - (a.step - 11) * 10.0 < 10.0 for a in part)
    # The machine's CPU of a slice is counted in the day's steps.
    cpu = [(99.0, 0.9), (105.0, 0.5), (112.0, 0.7), (121.0, 0.9)]
    assert cpu_by_step(cpu, 100.0, 10.0, 30, first=11, end=13)[10:14] == [None, 0.5, 0.7, None]
