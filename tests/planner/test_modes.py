"""The planner's modes (planner.modes) and the profile tables they read (planner.profile), exactly."""

from __future__ import annotations

import math

import pytest

from core.pools import Pool
from core.settings import PlannerThresholds
from planner.connectors.base import PoolRef
from planner.modes import Corrections, Forecast, SlaPlanner, threshold_plan, upper_forecast, with_headroom
from planner.observe import PoolState, TrafficSample
from planner.profile import DecodePoint, PrefillPoint, Profile, replicas_for

AGG = PoolRef("m", Pool.AGG)
T = PlannerThresholds(kv_high=0.8, kv_low=0.4, queue_high=2.0)


def state(workers: int, usage: float = 0.5, waiting: int = 0, queued: int = 0, running: int = 0) -> PoolState:
    return PoolState(AGG, workers, running=running, waiting=waiting, queued=queued, kv_usage=usage)


def test_threshold_mode_grows_on_kv_usage_to_the_middle_of_the_band() -> None:
    plan = threshold_plan(state(3, usage=0.9), T)
    assert plan.replicas == math.ceil(3 * 0.9 / 0.6) == 5


def test_threshold_mode_grows_by_the_queue_past_its_threshold() -> None:
    # 2 workers may hold 4 waiting; 10 wait: 6 too many, 3 more workers at 2 each.
    assert threshold_plan(state(2, usage=0.1, waiting=4, queued=6), T).replicas == 5


def test_threshold_mode_grows_by_at_least_one() -> None:
    assert threshold_plan(state(4, usage=0.81), T).replicas == 6  # ceil(4 * 0.81 / 0.6) = 6
    assert threshold_plan(state(10, usage=0.5, waiting=21), T).replicas == 11


def test_threshold_mode_shrinks_to_the_fewest_workers_that_stay_under_the_low_mark() -> None:
    # 4 workers at 0.15: 0.6 of one worker's KV in all; 2 workers hold it at 0.3 < 0.4, 1 would be at 0.6.
    assert threshold_plan(state(4, usage=0.15), T).replicas == 2
    assert threshold_plan(state(4, usage=0.15, queued=1), T).replicas == 4  # something waits: no shrinking
    assert threshold_plan(state(1, usage=0.0), T).replicas == 1


def test_threshold_mode_starts_a_worker_for_waiting_requests_when_none_lives() -> None:
    assert threshold_plan(state(0, usage=0, queued=3), T).replicas == 1
    assert threshold_plan(state(0, usage=0), T).replicas == 0


def profile() -> Profile:
    return Profile(engine="mocker", model="m", kv_tokens=100_000, max_num_seqs=64,
                   prefill=[PrefillPoint(isl=1000, ttft_s=0.1), PrefillPoint(isl=3000, ttft_s=0.5)],
                   decode=[DecodePoint(batch=1, context=1000, itl_s=0.01), DecodePoint(batch=64, context=1000, itl_s=0.073),
                           DecodePoint(batch=1, context=3000, itl_s=0.02), DecodePoint(batch=64, context=3000, itl_s=0.146)])


def test_profile_interpolates_and_holds_its_ends() -> None:
    p = profile()
    assert p.ttft_s(2000) == pytest.approx(0.3)
    assert p.ttft_s(10) == 0.1 and p.ttft_s(9000) == 0.5
    assert p.itl_s(32.5, 1000) == pytest.approx(0.0415)
    assert p.itl_s(1, 2000) == pytest.approx(0.015)
    assert p.max_batch(3000) == 33  # 100,000 tokens of KV hold 33 streams of 3,000
    # ITL at 1,000 tokens grows 1 ms per stream: 0.05 s holds 41 streams.
    assert p.decode_batch_within(0.05, 1000) == 41
    assert p.decode_batch_within(0.005, 1000) == 0
    assert p.decode_tokens_per_s(0.05, 1000) == pytest.approx(41 / 0.05)


def test_profile_round_trips(tmp_path) -> None:  # noqa: ANN001
    p = profile()
    p.save(tmp_path / "p.json")
    assert Profile.load(tmp_path / "p.json") == p


def test_replicas_round_up_but_not_for_rounding_noise() -> None:
    assert [replicas_for(x) for x in (0.0, 0.2, 2.0000000001, 2.01)] == [0, 1, 2, 3]


def test_sla_prefill_utilization_keeps_the_mean_ttft_within_the_target() -> None:
    sla = SlaPlanner(profile(), ttft_s=0.3, itl_s=0.05, prefill_utilization=0.9)
    s = 0.1
    rho = sla.prefill_rho(s)
    assert rho == pytest.approx(0.8)  # k = 2: 2k / (1 + 2k)
    # At that utilization the M/D/1 mean TTFT is the target exactly.
    assert s + rho * s / (2 * (1 - rho)) == pytest.approx(0.3)
    assert sla.prefill_rho(0.5) == 0.9  # out of reach: plan for throughput


def test_sla_disaggregated_plan() -> None:
    sla = SlaPlanner(profile(), ttft_s=0.3, itl_s=0.05, prefill_utilization=0.9)
    prefill, decode = sla.plan("m", "disagg", Forecast(rate=20.0, isl=1000, osl=100), Corrections())
    # prefill: 20 req/s x 0.1 s / 0.8 = 2.5 workers.
    assert (prefill.ref.pool, prefill.replicas) == (Pool.PREFILL, 3)
    # decode at context 1,050: the largest batch within 50 ms, and r * O * itl(b) streams at b per worker.
    batch, itl = sla.decode_batch(1050, Corrections())
    assert itl <= 0.05 < sla.profile.itl_s(batch + 1, 1050)
    assert (decode.ref.pool, decode.replicas) == (Pool.DECODE, math.ceil(20 * 100 * itl / batch))
    assert prefill.expected_ttft_s == pytest.approx(sla.expected_ttft_s(20.0, 1000, 3, Corrections()))


def test_sla_aggregated_plan_is_the_fewest_workers_whose_decode_meets_the_itl_with_the_prefills_between() -> None:
    sla = SlaPlanner(profile(), ttft_s=0.3, itl_s=0.05, prefill_utilization=0.9)
    f = Forecast(rate=20.0, isl=1000, osl=100)
    [agg] = sla.plan("m", "agg", f, Corrections())
    n = agg.replicas
    assert agg.ref == AGG

    def meets(k: int) -> bool:  # the docstring's conditions, by hand
        busy = 20.0 * 0.1 / k
        if busy >= 0.8:
            return False
        batch = sla.profile.decode_batch_within(0.05 * (1 - busy), 1050)
        itl = sla.profile.itl_s(batch, 1050) / (1 - busy)
        return batch > 0 and 20.0 * (100 * itl + 0.1) / k <= batch  # a stream's stay: its prefill and decode

    assert meets(n) and not meets(n - 1)
    # More than the decode pool alone needs: the prefills share the workers.
    assert n > sla.plan("m", "disagg", f, Corrections())[1].replicas


def test_an_aggregated_worker_holds_a_streams_kv_through_its_prefill_too() -> None:
    # Long prompts, short answers: the prefill is a large share of a stream's stay on the worker.
    one = Profile(engine="mocker", model="m", kv_tokens=100_000, max_num_seqs=64,
                  prefill=[PrefillPoint(isl=2000, ttft_s=0.2)],
                  decode=[DecodePoint(batch=1, context=2016, itl_s=0.04), DecodePoint(batch=9, context=2016, itl_s=0.12)])
    sla = SlaPlanner(one, ttft_s=1.2, itl_s=0.08, prefill_utilization=0.7)
    f = Forecast(rate=8.0, isl=2000, osl=32)
    [agg] = sla.plan("m", "agg", f, Corrections())
    k = agg.replicas

    def streams(n: int) -> tuple[float, float, int]:  # per worker: decoding, held (prefill too), the batch
        busy = 8.0 * 0.2 / n
        batch = one.decode_batch_within(0.08 * (1 - busy), 2016)
        itl = one.itl_s(batch, 2016) / (1 - busy)
        return 8.0 * 32 * itl / n, 8.0 * (32 * itl + 0.2) / n, batch

    _, held, batch = streams(k)
    assert held <= batch
    # One worker fewer holds more streams than its batch, the prefill's part of their stay decides it.
    decoding, held, batch = streams(k - 1)
    assert decoding <= batch < held


@pytest.mark.parametrize(("rate", "prefill", "decode"), [
    (2.0, 0, 1),  # one worker computing the prompts too, against 1 + 1 apart
    (5.0, 1, 1),  # 2 either way: the pools are kept
    (10.0, 0, 3),  # 3 against 2 + 2
    (20.0, 3, 3),  # 6 either way
])
def test_with_local_prefill_the_prefill_pool_goes_to_zero_only_when_that_saves_a_worker(
        rate: float, prefill: int, decode: int) -> None:
    f = Forecast(rate=rate, isl=1000, osl=100)
    local = SlaPlanner(profile(), ttft_s=0.3, itl_s=0.05, prefill_utilization=0.9, local_prefill=True)
    apart = SlaPlanner(profile(), ttft_s=0.3, itl_s=0.05, prefill_utilization=0.9)
    p, d = local.plan("m", "disagg", f, Corrections())
    assert (p.ref.pool, p.replicas, d.ref.pool, d.replicas) == (Pool.PREFILL, prefill, Pool.DECODE, decode)
    n, itl = local.agg_workers(f, Corrections())
    if prefill == 0:  # the decode pool sized as aggregated workers, with their ITL and TTFT
        assert d.replicas == n and d.expected_itl_s == itl and "the decode pool computes the prompts" in d.reason
        assert d.expected_ttft_s == local.expected_ttft_s(rate, 1000, n, Corrections())
        # Each carries its plan apart, for while the prefill pool keeps workers (planner.scaling.decode_wish);
        # the fast path asks for that one alone.
        assert [p.apart, d.apart] == apart.plan("m", "disagg", f, Corrections())
        assert local.plan("m", "disagg", f, Corrections(), keep_apart=True) == [p.apart, d.apart]
    else:  # the plan without the option
        assert (p, d) == tuple(apart.plan("m", "disagg", f, Corrections()))
        assert p.apart is None and d.apart is None
        assert n == p.replicas + d.replicas
    # On a tie, a decode pool that already computes its prompts goes on alone.
    kept = local.plan("m", "disagg", f, Corrections(), local_now=True)
    assert [x.replicas for x in kept] == ([0, n] if n <= p.replicas + d.replicas else [p.replicas, d.replicas])
    # The aggregated layout has no prefill pool to drop.
    assert local.plan("m", "agg", f, Corrections()) == apart.plan("m", "agg", f, Corrections())


def test_the_decode_is_sized_at_the_token_weighted_context_and_the_forecasts_variants_keep_it() -> None:
    sla = SlaPlanner(profile(), ttft_s=0.3, itl_s=0.05, prefill_utilization=0.9)
    mixed = Forecast(rate=20.0, isl=1200, osl=100)  # isl + osl / 2 = 1,250
    weighted = Forecast(rate=20.0, isl=1200, osl=100, context=1050.0)
    assert (mixed.decode_context, weighted.decode_context) == (1250.0, 1050.0)
    # The batch that meets the ITL at 1,050 tokens is larger than at 1,250: fewer decode workers.
    assert sla.decode_batch(1050, Corrections())[0] > sla.decode_batch(1250, Corrections())[0]
    assert sla.needs(weighted, Corrections())[1] < sla.needs(mixed, Corrections())[1]
    assert sla.agg_workers(weighted, Corrections())[0] <= sla.agg_workers(mixed, Corrections())[0]
    assert with_headroom(weighted, 1.0, 60.0).context == upper_forecast(weighted, 3.0, 60.0).context == 1050.0
    assert Forecast(rate=1.0, isl=1200, osl=100, context=0.0).decode_context == 1250.0  # unknown


def test_the_floor_follows_the_load_already_there() -> None:
    sla = SlaPlanner(profile(), ttft_s=0.3, itl_s=0.05)
    f = Forecast(rate=1.0, isl=1000, osl=100)
    # At context 1,050 the ITL target holds 39 streams: 39 x 1,050 / 100,000 = 0.41 of the KV.
    assert sla.profile.decode_batch_within(0.05, 1050) == 39
    n, why = sla.floor(state(2, usage=0.8), f, Corrections())
    assert n == math.ceil(2 * 0.8 / (39 * 1050 / 100_000)) == 4 and "kv usage 0.80" in why
    # 9 prompts of 0.1 s waiting: 3 workers compute them within 0.3 s.
    assert sla.floor(state(1, usage=0.0, queued=9), f, Corrections())[0] == 3
    assert sla.floor(PoolState(PoolRef("m", Pool.DECODE), 1, queued=9), f, Corrections())[0] == 0
    # ... unless the decode pool computes its prompts itself (no prefill worker live).
    assert sla.floor(PoolState(PoolRef("m", Pool.DECODE), 1, queued=9), f, Corrections(), local=True)[0] == 3
    # A decode pool whose prompts the prefill pool computes takes its KV target at its own ITL: at 0.0625 s
    # a worker holds more streams, so the same usage asks for fewer workers. A pool that computes prompts
    # (aggregated, or a decode pool computing its own) keeps the plan's.
    wider = SlaPlanner(profile(), ttft_s=0.3, itl_s=0.05, decode_floor_itl_s=0.0625)
    batch = wider.profile.decode_batch_within(0.0625, 1050)
    assert batch > 39
    apart = PoolState(PoolRef("m", Pool.DECODE), 2, kv_usage=0.8)
    n, why = wider.floor(apart, f, Corrections())
    assert n == math.ceil(2 * 0.8 / (batch * 1050 / 100_000)) < 4 and f"target {batch * 1050 / 100_000:.2f}" in why
    assert wider.floor(apart, f, Corrections(), local=True)[0] == 4
    assert wider.floor(state(2, usage=0.8), f, Corrections())[0] == 4


def test_corrections_scale_the_plan_and_are_smoothed_and_bounded() -> None:
    sla = SlaPlanner(profile(), ttft_s=0.3, itl_s=0.05, prefill_utilization=0.9)
    f = Forecast(rate=20.0, isl=1000, osl=100)
    slow = Corrections(prefill=1.5)
    assert sla.plan("m", "disagg", f, slow)[0].replicas > sla.plan("m", "disagg", f, Corrections())[0].replicas
    c = Corrections()
    c.update("prefill", observed=0.2, expected=0.1)
    assert c.prefill == pytest.approx(1.5)  # halfway to 2.0
    c.update("decode", observed=100.0, expected=0.01)
    assert c.decode == pytest.approx(2.5)  # halfway to the bound 4.0
    c.update("decode", observed=None, expected=0.01)
    c.update("decode", observed=1.0, expected=math.inf)
    assert c.decode == pytest.approx(2.5)


def test_sla_corrections_compare_what_was_observed_with_what_the_profile_expected_for_that_load() -> None:
    sla = SlaPlanner(profile(), ttft_s=0.3, itl_s=0.05)
    states = {PoolRef("m", Pool.PREFILL): PoolState(PoolRef("m", Pool.PREFILL), 2),
              PoolRef("m", Pool.DECODE): PoolState(PoolRef("m", Pool.DECODE), 2, running=20)}
    expected_ttft = sla.expected_ttft_s(5.0, 1000, 2, Corrections())
    expected_itl = sla.profile.itl_s(10, 1050)
    sample = TrafficSample(10.0, 50, 50, 1000.0, 100.0, expected_ttft * 2, expected_itl)
    c = Corrections()
    sla.correct(c, sample, states, "m", "disagg")
    assert c.prefill == pytest.approx(1.5) and c.decode == pytest.approx(1.0)


def test_the_rate_is_planned_with_headroom_for_a_busier_interval() -> None:
    from planner.modes import with_headroom

    f = Forecast(rate=4.0, isl=100, osl=10)
    assert with_headroom(f, 1.3, 10.0) == Forecast(4.0 + 1.3 * math.sqrt(0.4), 100, 10)
    assert with_headroom(f, 0.0, 10.0) == f and with_headroom(Forecast(0.0, 1, 1), 1.3, 10.0).rate == 0.0
    # Longer intervals average more arrivals: less headroom.
    assert with_headroom(f, 1.3, 60.0).rate < with_headroom(f, 1.3, 10.0).rate


def test_the_upper_end_of_an_intervals_rate_counts_at_least_one_arrivals_spread() -> None:
    from planner.modes import upper_forecast

    # 240 arrivals in 60 s: 4 +- 3 sqrt(240) / 60.
    assert upper_forecast(Forecast(4.0, 100, 10), 3.0, 60.0) == Forecast((240 + 3 * math.sqrt(240)) / 60, 100, 10)
    # None arrived: the rate may still have been up to 3 arrivals' worth.
    assert upper_forecast(Forecast(0.0, 100, 10), 3.0, 60.0).rate == pytest.approx(3 / 60)


def test_a_fall_counts_as_sure_only_past_the_noise_of_both_intervals_counts() -> None:
    from planner.modes import rate_fell

    # 300 then 240 arrivals in 60 s: a fall of 60 against 3 sqrt(540) = 69.7: noise can explain it.
    assert not rate_fell(5.0, 4.0, 3.0, 60.0)
    # 300 then 180: 120 against 3 sqrt(480) = 65.7.
    assert rate_fell(5.0, 3.0, 3.0, 60.0)
    # A rise is never a fall; nothing then nothing is not one either.
    assert not rate_fell(3.0, 5.0, 3.0, 60.0) and not rate_fell(0.0, 0.0, 3.0, 60.0)


def test_a_rise_counts_as_sure_only_past_the_noise_of_the_forecasts_count() -> None:
    from planner.modes import rate_rose

    # 1 req/s forecast, 20 s in: 20 expected, 3 sqrt(20) = 13.4 more needed.
    assert not rate_rose(1.0, 33, 20.0, 3.0) and rate_rose(1.0, 34, 20.0, 3.0)
    # Nothing forecast: the noise of one arrival's count still stands (3 arrivals are not a ramp).
    assert not rate_rose(0.0, 2, 5.0, 3.0) and rate_rose(0.0, 3, 5.0, 3.0)
    # A fall is never a rise; no time passed, no rise.
    assert not rate_rose(2.0, 10, 20.0, 3.0) and not rate_rose(1.0, 5, 0.0, 3.0)


def test_a_sure_rise_sizes_the_pools_on_the_rate_observed_so_far() -> None:
    sla = SlaPlanner(profile(), ttft_s=0.8, itl_s=0.05)
    f = Forecast(rate=1.0, isl=1000, osl=100)
    at_10 = {p.ref: p.replicas for p in sla.plan("m", "agg", Forecast(10.0, 1000, 100), Corrections())}
    assert sla.rise_replicas("m", "agg", f, 200, 20.0, Corrections(), 3.0) == at_10 and at_10[AGG] > 1
    assert sla.rise_replicas("m", "agg", f, 25, 20.0, Corrections(), 3.0) == {}  # within the noise
    assert sla.rise_replicas("m", "agg", f, 200, 20.0, Corrections(), 0.0) == {}  # off


def test_the_workers_step_models_against_the_profiles_scale_the_plan() -> None:
    from core.timing import TimingModel

    reference = TimingModel((10.0, 0.01, 0.0), (5.0, 20.0, 0.0))
    twice = TimingModel((20.0, 0.02, 0.0), (10.0, 40.0, 0.0))
    sla = SlaPlanner(profile().model_copy(update={"timing": reference.encode()}), ttft_s=0.3, itl_s=0.05)
    f = Forecast(rate=20.0, isl=1000, osl=100)
    slow = PoolState(AGG, 2, timings=(twice, twice))
    assert sla.model_factors(f, slow, slow) == pytest.approx((2.0, 2.0))
    assert sla.model_factors(f, PoolState(AGG, 2), None) == (None, None)  # no worker model: nothing to say
    assert SlaPlanner(profile(), 0.3, 0.05).model_factors(f, slow, slow) == (None, None)  # a profile without one
    c = Corrections()
    c.set_models(*sla.model_factors(f, slow, slow))
    assert (c.prefill_factor, c.decode_factor) == pytest.approx((2.0, 2.0))
    # Twice as slow a prompt is twice the prefill service time the plan sizes for.
    assert sla.prefill_service_s(1000, c) == pytest.approx(2 * sla.prefill_service_s(1000, Corrections()))
    c.set_models(9.0, None)
    assert c.prefill_model == 4.0 and c.decode_model == pytest.approx(2.0)  # bounded; None leaves it


def test_a_sure_rise_keeps_the_pools_apart_unless_the_decode_pool_computes_the_prompts_already() -> None:
    local = SlaPlanner(profile(), ttft_s=0.3, itl_s=0.05, prefill_utilization=0.9, local_prefill=True)
    f, seen = Forecast(rate=1.0, isl=1000, osl=100), Forecast(rate=10.0, isl=1000, osl=100)  # 200 in 20 s
    alone = {p.ref: p.replicas for p in local.plan("m", "disagg", seen, Corrections())}
    apart = {p.ref: p.replicas for p in local.plan("m", "disagg", seen, Corrections(), keep_apart=True)}
    assert alone != apart and alone[PoolRef("m", Pool.PREFILL)] == 0  # 3 alone against 2 + 2 apart
    # The fast path cannot take the prefill pool's workers away: the rise is sized apart.
    assert local.rise_replicas("m", "disagg", f, 200, 20.0, Corrections(), 3.0) == apart
    assert local.rise_replicas("m", "disagg", f, 200, 20.0, Corrections(), 3.0, local_now=True) == alone


@pytest.mark.parametrize("rate", [0.5, 4.0, 8.2, 20.0])
def test_each_plan_says_the_fractional_workers_it_rounds_up(rate: float) -> None:
    f = Forecast(rate=rate, isl=1000, osl=100)
    sla = SlaPlanner(profile(), ttft_s=0.8, itl_s=0.05, prefill_utilization=0.7, local_prefill=True)
    [agg] = sla.plan("m", "agg", f, Corrections())
    assert agg.need is not None and agg.replicas - 1 < agg.need <= agg.replicas
    # Where the aggregated workers' time starts to meet the targets, to a thousandth of a worker.
    assert sla.agg_fit(f, Corrections(), agg.need) is not None
    assert sla.agg_fit(f, Corrections(), agg.need - 0.002) is None
    prefill, decode, _, _ = sla.needs(f, Corrections())
    apart = sla.plan("m", "disagg", f, Corrections(), keep_apart=True)
    assert [p.need for p in apart] == [prefill, decode]
    plans = sla.plan("m", "disagg", f, Corrections())
    if plans[0].replicas == 0:  # the decode pool alone needs what aggregated workers do
        assert plans[1].need == agg.need and plans[0].need == 0.0
