"""The planner's loop against a real Redis: it reads worker leases (written through the registry, as
workers write them) and the frontends' counters, decides, writes its decisions and the virtual
connector's targets, keeps one acting planner per namespace, and resumes from its state."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import redis.asyncio as aioredis

from core.keys import Keys
from core.pools import Pool
from core.settings import PlannerSettings
from planner.connectors.base import PoolRef
from planner.connectors.virtual import VirtualConnector
from planner.controller import Planner
from planner.decision import PoolDecision, decode_state, encode
from planner.modes import Corrections, Forecast
from planner.status import last_decisions, planner_json
from router.frontends import FrontendRecord, FrontendRegistry, LoadCounters
from router.registry import Registry, WorkerLoad, WorkerRecord
from tests.planner.test_modes import profile as sla_profile

MODEL = "m"
AGG = PoolRef(MODEL, Pool.AGG)


@pytest.fixture
async def redis(redis_server, namespace) -> AsyncIterator[aioredis.Redis]:  # noqa: ANN001
    client = aioredis.from_url(redis_server.url)
    yield client
    async for key in client.scan_iter(match=f"sluice:{namespace}:*"):
        await client.delete(key)
    await client.aclose()


async def put_worker(redis: aioredis.Redis, keys: Keys, wid: str, *, usage: float, waiting: int = 0,
                     draining: bool = False, pool: Pool = Pool.AGG) -> None:
    record = WorkerRecord(worker_id=wid, model=MODEL, model_path="/m", pool=pool, queue=keys.worker_queue(wid),
                          pool_queue=keys.pool_queue(MODEL, pool.value), engine="mocker", block_size=16,
                          kv_blocks=1000, max_num_seqs=64, context_length=4096, started_at=1.0)
    load = WorkerLoad(running=4, waiting=waiting, active_blocks=int(usage * 1000), total_blocks=1000, draining=draining)
    await Registry(redis, keys).register(record, load, ttl_s=60)


def arrivals_publisher(frontends: FrontendRegistry) -> Callable[[int], Awaitable[None]]:
    """Publishes one frontend's count of arrivals (what the planner's traffic meter reads)."""
    async def publish(arrivals: int) -> None:
        await frontends.renew(FrontendRecord(frontend_id="f1", url="u", metrics_url="m", router_mode="kv",
                                             started_at=0.0, load={MODEL: LoadCounters(arrived=arrivals).as_list()}),
                              ttl_s=60)
    return publish


async def loaded_sla_planner(redis: aioredis.Redis, keys: Keys, **over: object,
                             ) -> tuple[Planner, list[float], Callable[[int], Awaitable[None]]]:
    """An ``sla`` planner at clock 100 s over one worker at KV usage 0.8 (the floor's 2 workers,
    test_the_sla_floor_...), its interval of 60 s started with 10 arrivals counted and a forecast of 0.1
    requests/s; with its clock and the publisher of the frontend's count."""
    await put_worker(redis, keys, "w0", usage=0.8)
    publish = arrivals_publisher(FrontendRegistry(redis, keys))
    clock = [100.0]
    p = Planner(settings(mode="sla", itl_s=0.0625, ttft_s=1.0, cooldown_intervals=2, interval_s=60.0, **over),
                [MODEL], redis, keys, VirtualConnector(redis, keys), profile=sla_profile(), clock=lambda: clock[0])
    await publish(10)
    await p.resume()  # the interval starts: the counters' baseline
    p.forecasters[MODEL].observe(0.1, 1000, 100)
    return p, clock, publish


def settings(**over: object) -> PlannerSettings:
    base: dict[str, object] = {"interval_s": 0.2, "fast_interval_s": 0.05, "min_replicas": 1, "max_replicas": 6,
                               "budget": 10, "down_after_intervals": 2, "cooldown_intervals": 0, "lock_ttl_s": 2.0}
    return PlannerSettings(**{**base, **over})


def planner(redis: aioredis.Redis, keys: Keys, **over: object) -> Planner:
    return Planner(settings(**over), [MODEL], redis, keys, VirtualConnector(redis, keys))


async def test_a_pool_past_its_kv_threshold_grows_and_the_decision_is_kept_with_its_reason(redis, namespace) -> None:  # noqa: ANN001
    keys = Keys(namespace)
    for i in range(2):
        await put_worker(redis, keys, f"w{i}", usage=0.9)
    p = planner(redis, keys)
    decision = await p.step("interval")
    [pool] = decision.pools
    assert (pool.live, pool.requested, pool.wanted, pool.target, pool.action) == (2, 2, 3, 3, "up")
    assert "kv usage 0.90" in pool.reason
    assert await VirtualConnector(redis, keys).targets() == {"m/agg": 3}
    [kept] = await last_decisions(redis, keys)
    assert kept == decision
    status = await planner_json(redis, keys)
    assert status["targets"] == {"m/agg": 3} and status["decisions"][0]["pools"][0]["target"] == 3


async def test_shrinking_waits_for_two_intervals_and_draining_workers_do_not_count(redis, namespace) -> None:  # noqa: ANN001
    keys = Keys(namespace)
    for i in range(4):
        await put_worker(redis, keys, f"w{i}", usage=0.05)
    await put_worker(redis, keys, "gone", usage=0.9, draining=True)
    p = planner(redis, keys)
    first = await p.step("interval")
    assert (first.pools[0].live, first.pools[0].draining, first.pools[0].target) == (4, 1, 4)
    assert first.pools[0].action == "hold" and "1 of 2" in first.pools[0].reason
    fast = await p.step("fast")  # the fast path never shrinks, and does not count as an interval
    assert fast.pools[0].target == 4 and fast.tick == first.tick
    second = await p.step("interval")
    assert (second.pools[0].action, second.pools[0].target) == ("down", 1)


async def test_the_fast_path_grows_on_a_burst_between_intervals_and_keeps_only_the_ticks_that_acted(
        redis, namespace) -> None:  # noqa: ANN001
    keys = Keys(namespace)
    await put_worker(redis, keys, "w0", usage=0.3, waiting=9)
    p = planner(redis, keys, burst_queue=10.0)
    assert await last_decisions(redis, keys) == []
    await p.step("fast")  # 9 waiting, no burst yet: a quiet tick, not kept
    assert await last_decisions(redis, keys) == []
    p.s.burst_queue = 4.0
    decision = await p.step("fast")
    assert (decision.pools[0].action, decision.pools[0].target) == ("up", 3)  # 9 waiting, 4 a worker: 1 + 2
    assert [d.kind for d in await last_decisions(redis, keys)] == ["fast"]


async def test_the_sla_floor_grows_a_pool_on_the_load_there_but_not_back_just_after_a_shrink(redis, namespace) -> None:  # noqa: ANN001
    keys = Keys(namespace)
    await put_worker(redis, keys, "w0", usage=0.8)  # under the burst threshold (0.9), over the floor's 0.41 (test_modes)
    p = Planner(settings(mode="sla", itl_s=0.0625, ttft_s=1.0, cooldown_intervals=2), [MODEL], redis, keys,
                VirtualConnector(redis, keys), profile=sla_profile())
    p.forecasters[MODEL].observe(0.1, 1000, 100)  # a quiet interval: the plan from the rate is one worker
    p.tick = 10
    p.memory[AGG].last_down, p.memory[AGG].shrunk_from = 9, 2  # hysteresis shrank the pool 2 -> 1 one interval ago
    held = await p.step("fast")
    assert (held.pools[0].action, held.pools[0].target, held.pools[0].held) == ("hold", 1, 2)
    assert "kv usage 0.80" in held.pools[0].reason and "2 workers held (shrank from 2 at interval 9)" in held.pools[0].reason
    # A fast tick that held a pool is kept, as one that acted is (a quiet one is not).
    [kept] = await last_decisions(redis, keys)
    assert (kept.kind, kept.pools[0].held) == ("fast", 2)
    await put_worker(redis, keys, "w0", usage=0.85)  # 3 workers' worth: more than it had, so not a flap
    p.s.max_replicas = 2  # ... unless the bounds keep it at the size it had
    assert (await p.step("fast")).pools[0].action == "hold"
    p.s.max_replicas = 6
    past = await p.step("fast")
    assert (past.pools[0].action, past.pools[0].target) == ("up", 3)


@pytest.mark.parametrize(("rise_z", "arrived", "target", "why"), [
    (3.0, 200, 3, "a sure rise: 200 arrivals in 20 s against 2.0 forecast: 3 workers"),  # 10 req/s: 3 workers
    (3.0, 20, 2, "kv usage 0.80"),  # 1 req/s needs 1 worker, but the rise lifts the hold of the floor's 2
    (3.0, 4, 1, "2 workers held"),  # 2 expected: 4 is within the noise (3 sqrt(2) = 4.2)
    (0.0, 200, 1, "2 workers held"),  # off
])
async def test_a_sure_rise_in_the_interval_so_far_grows_the_pool_at_once_even_just_after_a_shrink(
        redis, namespace, rise_z: float, arrived: int, target: int, why: str) -> None:  # noqa: ANN001
    keys = Keys(namespace)
    p, clock, publish = await loaded_sla_planner(redis, keys, sure_rise_z=rise_z)  # 2 arrivals expected in 20 s
    p.tick = 10
    p.memory[AGG].last_down, p.memory[AGG].shrunk_from = 9, 2  # hysteresis shrank the pool 2 -> 1 one interval ago
    clock[0] = 120.0
    await publish(10 + arrived)
    [pool] = (await p.step("fast")).pools
    assert (pool.action, pool.target) == ("up" if target > 1 else "hold", target)
    assert why in pool.reason
    assert pool.held == (2 if target == 1 else None)
    if target == 1 and rise_z > 0:  # the record says what the interval so far was, and that it was noise
        assert f"{arrived} arrivals in 20 s against 2.0 forecast: not a sure rise" in pool.reason
    # The fast path only looked: the interval still counts its arrivals from its start.
    clock[0] = 160.0
    [view] = (await p.step("interval")).models
    assert view.observed is not None and view.observed.rate == pytest.approx(arrived / 60)


@pytest.mark.parametrize("just_shrank", [False, True])
@pytest.mark.parametrize(("kind", "arrived", "target"), [
    ("fast", 2, 1),  # 2 expected in the 20 s so far: within the noise, the floor's 2 held
    ("fast", 5, 2),  # 2.1 deviations over (under the sure rise's 3): the floor grows the pool
    ("interval", 6, 1),  # the interval that ended had the 6 forecast for it
    ("interval", 14, 2),  # 3.3 deviations over the 6 forecast
])
async def test_with_a_floor_rise_z_the_floor_grows_a_pool_only_on_arrivals_above_the_forecast(
        redis, namespace, kind: str, arrived: int, target: int, just_shrank: bool) -> None:  # noqa: ANN001
    """... and such a rise lifts the floor's hold within the cooldown of a shrink, as the sure rise does."""
    keys = Keys(namespace)
    p, clock, publish = await loaded_sla_planner(redis, keys, floor_rise_z=1.0)  # the rate's plan: one worker
    if just_shrank:  # hysteresis shrank the pool 2 -> 1 an interval ago
        p.tick = 10
        p.memory[AGG].last_down, p.memory[AGG].shrunk_from = 9 if kind == "fast" else 10, 2
    clock[0] = 120.0 if kind == "fast" else 160.0
    await publish(10 + arrived)
    [pool] = (await p.step(kind)).pools
    assert (pool.action, pool.target) == ("up" if target > 1 else "hold", target)
    assert "kv usage 0.80" in pool.reason
    if target == 1:  # the gate's hold, just after a shrink too
        assert pool.held == 2 and "2 workers held (arrivals within 1 deviations of the forecast)" in pool.reason


@pytest.mark.parametrize(("sure_z", "usage", "action"), [(3.0, 0.05, "down"), (0.0, 0.05, "hold"), (3.0, 0.6, "hold")])
async def test_a_sure_fall_shrinks_at_the_first_interval_unless_off_or_the_load_on_the_pool_needs_the_workers(
        redis, namespace, sure_z: float, usage: float, action: str) -> None:  # noqa: ANN001
    keys = Keys(namespace)
    for i in range(6):
        await put_worker(redis, keys, f"w{i}", usage=usage)
    p = Planner(settings(mode="sla", itl_s=0.0625, ttft_s=1.0, cooldown_intervals=2, interval_s=60.0,
                         sure_shrink_z=sure_z), [MODEL], redis, keys, VirtualConnector(redis, keys), profile=sla_profile())
    p.forecasters[MODEL].observe(1.0, 1000, 100)  # 60 arrivals in an interval, then none: past any noise
    p.forecasters[MODEL].observe(0.0, None, None)
    decision = await p.step("interval")
    [pool] = decision.pools
    assert pool.action == action
    if action == "down":
        assert pool.target == 1 and "a sure fall" in pool.reason
    else:
        assert pool.target == 6 and "a sure fall" not in pool.reason
        assert "1 of 2 intervals wanted fewer" in pool.reason if usage < 0.1 else "kv usage 0.60" in pool.reason


@pytest.mark.parametrize("local_prefill", [True, False])
async def test_with_local_prefill_a_quiet_disaggregated_model_drops_its_prefill_pool_and_the_decode_pool_computes(
        redis, namespace, local_prefill: bool) -> None:  # noqa: ANN001
    keys = Keys(namespace)
    await put_worker(redis, keys, "p0", usage=0.0, pool=Pool.PREFILL)
    await put_worker(redis, keys, "d0", usage=0.05, pool=Pool.DECODE)
    p = Planner(settings(mode="sla", layout="disagg", local_prefill=local_prefill, itl_s=0.0625, ttft_s=1.0,
                         interval_s=60.0, burst_queue=20.0, down_after_intervals=1),
                [MODEL], redis, keys, VirtualConnector(redis, keys), profile=sla_profile())
    p.forecasters[MODEL].observe(0.5, 1000, 100)  # one worker computing its prompts, against 1 + 1 apart
    pools = {x.pool: x for x in (await p.step("interval")).pools}
    assert (pools["prefill"].target, pools["decode"].target) == ((0, 1) if local_prefill else (1, 1))
    assert ("the decode pool computes the prompts" in pools["decode"].reason) == local_prefill
    if not local_prefill:
        return
    assert pools["prefill"].action == "down"
    # The prefill worker went: the decode pool's waiting prompts are its own now, and its floor counts them
    # (9 prompts of 0.1 s within the 0.8 s aimed at: 2 workers); the prefill pool stays at 0.
    await Registry(redis, keys).deregister("p0")
    await put_worker(redis, keys, "d0", usage=0.05, pool=Pool.DECODE, waiting=9)
    pools = {x.pool: x for x in (await p.step("fast")).pools}
    assert (pools["prefill"].target, pools["decode"].action, pools["decode"].target) == (0, "up", 2)
    assert "9 prompts waiting" in pools["decode"].reason


@pytest.mark.parametrize(("margin", "prefill_live", "target"), [
    (1.0, True, 1),  # the target itself, the prompts computed apart: 51 streams of 1,050 tokens, 0.54 of the KV
    (None, True, 2),  # the plan's margin: 0.8 of the target, 39 streams, 0.41
    (1.0, False, 2),  # the decode pool computes its prompts (no prefill worker live): the plan's margin
])
async def test_a_decode_pool_apart_takes_its_floor_at_its_own_margin_of_the_itl_target(
        redis, namespace, margin: float | None, prefill_live: bool, target: int) -> None:  # noqa: ANN001
    keys = Keys(namespace)
    if prefill_live:
        await put_worker(redis, keys, "p0", usage=0.0, pool=Pool.PREFILL)
    await put_worker(redis, keys, "d0", usage=0.5, pool=Pool.DECODE)
    p = Planner(settings(mode="sla", layout="disagg", local_prefill=True, itl_s=0.0625, ttft_s=1.0,
                         decode_floor_margin=margin, min_replicas=0), [MODEL], redis, keys,
                VirtualConnector(redis, keys), profile=sla_profile())
    p.forecasters[MODEL].observe(0.1, 1000, 100)  # a quiet interval: the plan from the rate is one worker
    decode = {x.pool: x for x in (await p.step("fast")).pools}["decode"]
    assert (decode.action, decode.target) == ("up" if target > 1 else "hold", target)
    assert target == 1 or "kv usage 0.50 (target 0.41)" in decode.reason


def counters_publisher(frontends: FrontendRegistry) -> Callable[[float, int, int], Awaitable[None]]:
    """Publishes one frontend's counters after another 60 s of ``rate`` requests/s of ``isl`` and ``osl``
    tokens, all finished (the interval's rate and lengths the planner's traffic meter reads)."""
    total = LoadCounters()

    async def publish(rate: float, isl: int, osl: int) -> None:
        n = round(rate * 60)
        total.arrived += n
        total.finished += n
        total.input_tokens += n * isl
        total.output_tokens += n * osl
        await frontends.renew(FrontendRecord(frontend_id="f1", url="u", metrics_url="m", router_mode="kv",
                                             started_at=0.0, load={MODEL: total.as_list()}), ttl_s=60)
    return publish


async def test_moving_the_prompts_between_the_pools_changes_both_pools_together(redis, namespace) -> None:  # noqa: ANN001
    keys = Keys(namespace)
    for wid, pool in (("p0", Pool.PREFILL), ("p1", Pool.PREFILL), ("d0", Pool.DECODE), ("d1", Pool.DECODE)):
        await put_worker(redis, keys, wid, usage=0.05, pool=pool)
    publish = counters_publisher(FrontendRegistry(redis, keys))
    clock = [100.0]
    p = Planner(settings(mode="sla", layout="disagg", local_prefill=True, itl_s=0.0625, ttft_s=1.0, interval_s=60.0,
                         sure_shrink_z=0.0),
                [MODEL], redis, keys, VirtualConnector(redis, keys), profile=sla_profile(), clock=lambda: clock[0])
    await publish(0.0, 0, 0)
    await p.resume()

    async def interval(rate: float, isl: int, osl: int) -> dict[str, PoolDecision]:
        clock[0] += 60.0
        await publish(rate, isl, osl)
        return {x.pool: x for x in (await p.step("interval")).pools}

    # 9 requests/s of 1,000 and 100 tokens: the decode pool alone takes 3 workers (2.27), the pools apart 2 + 2. The
    # prefill pool's drop to 0 waits a second interval (down_after 2), and the decode pool waits with it at
    # its size apart: growing it to 3 beside 2 prefill workers would pay for both (and shrink it back if the
    # next plan kept the pools apart).
    pools = await interval(9.0, 1000, 100)
    assert (pools["prefill"].target, pools["decode"].target) == (2, 2)
    assert "the prefill pool keeps 2 workers, so the prompts stay there" in pools["decode"].reason
    assert pools["decode"].wanted == 2
    pools = await interval(9.0, 1000, 100)
    assert (pools["prefill"].action, pools["prefill"].target, pools["decode"].action, pools["decode"].target) == (
        "down", 0, "up", 3)
    assert "the decode pool computes the prompts" in pools["decode"].reason
    # The prompts go back: with decode steps twice as slow as the profile's, 1 request/s of 3,000 and 10
    # tokens takes 1 + 1 apart and 3 alone. The prefill pool grows at once, and the decode pool shrinks with
    # it, not two intervals later.
    for wid in ("p0", "p1"):
        await Registry(redis, keys).deregister(wid)
    for wid in ("d0", "d1", "d2"):  # little KV held: the floor stays under 1 worker at 3,000 tokens of context
        await put_worker(redis, keys, wid, usage=0.02, pool=Pool.DECODE)
    p.corrections[MODEL] = Corrections(decode=2.0)
    pools = await interval(1.0, 3000, 10)
    assert (pools["prefill"].action, pools["prefill"].target, pools["decode"].action, pools["decode"].target) == (
        "up", 1, "down", 1)
    assert pools["decode"].reason.startswith("down (the prefill pool grows from 0 to 1)")


async def test_the_budget_and_bounds_hold(redis, namespace) -> None:  # noqa: ANN001
    keys = Keys(namespace)
    for i in range(3):
        await put_worker(redis, keys, f"p{i}", usage=1.0, pool=Pool.PREFILL, waiting=50)
        await put_worker(redis, keys, f"d{i}", usage=1.0, pool=Pool.DECODE, waiting=50)
    p = planner(redis, keys, layout="disagg", max_replicas=5, budget=7)
    decision = await p.step("interval")
    targets = {x.pool: x.target for x in decision.pools}
    assert sum(targets.values()) == 7 and all(t <= 5 for t in targets.values())
    assert all(x.wanted == 5 for x in decision.pools) and "budget" in decision.pools[0].reason


async def test_the_fast_path_grows_a_pool_only_into_what_the_budget_leaves_and_never_cuts_another(
        redis, namespace) -> None:  # noqa: ANN001
    keys = Keys(namespace)
    await put_worker(redis, keys, "p0", usage=0.9, pool=Pool.PREFILL, waiting=24)  # a burst: 6 workers wanted
    for i in range(7):
        await put_worker(redis, keys, f"d{i}", usage=0.1, pool=Pool.DECODE)
    p = planner(redis, keys, layout="disagg", max_replicas=8, budget=10)
    decision = await p.step("fast")
    pools = {x.pool: x for x in decision.pools}
    assert (pools["prefill"].action, pools["prefill"].target) == ("up", 3)  # 10 less the decode pool's 7
    assert (pools["decode"].action, pools["decode"].target) == ("hold", 7)
    assert pools["prefill"].held == pools["prefill"].wanted > 3 and pools["decode"].held is None  # the budget's cut


async def test_traffic_is_read_from_the_frontends_counters_and_predicted(redis, namespace) -> None:  # noqa: ANN001
    keys = Keys(namespace)
    await put_worker(redis, keys, "w0", usage=0.5)
    frontends = FrontendRegistry(redis, keys)

    async def publish(counters: LoadCounters) -> None:
        await frontends.renew(FrontendRecord(frontend_id="f1", url="u", metrics_url="m", router_mode="kv",
                                             started_at=0.0, load={MODEL: counters.as_list()}), ttl_s=60)

    clock = [100.0]
    p = Planner(settings(predictor="constant"), [MODEL], redis, keys, VirtualConnector(redis, keys),
                clock=lambda: clock[0])
    await publish(LoadCounters(arrived=10, finished=10))
    await p.resume()  # the baseline
    clock[0] = 110.0
    await publish(LoadCounters(arrived=60, finished=50, input_tokens=40 * 300, output_tokens=40 * 20,
                               ttft_s=40 * 0.25, ttft_n=40, decode_s=40 * 19 * 0.01, gaps=40 * 19))
    decision = await p.step("interval")
    [view] = decision.models
    assert view.observed is not None and view.predicted is not None
    assert view.observed.rate == pytest.approx(5.0) and view.observed.isl == pytest.approx(300)
    assert view.observed.ttft_s == pytest.approx(0.25) and view.observed.itl_s == pytest.approx(0.01)
    assert (view.predicted.rate, view.predicted.isl, view.predicted.osl) == pytest.approx((5.0, 300, 20))


async def test_one_planner_acts_and_a_standby_takes_over_when_it_stops(redis, namespace) -> None:  # noqa: ANN001
    keys = Keys(namespace)
    await put_worker(redis, keys, "w0", usage=0.5)
    a, b = planner(redis, keys), planner(redis, keys)
    stop_a, stop_b = asyncio.Event(), asyncio.Event()
    run_a = asyncio.create_task(a.run(stop_a))
    await _until(lambda: a.last is not None)
    run_b = asyncio.create_task(b.run(stop_b))
    await asyncio.sleep(0.5)
    assert b.last is None and await a.lease.holder() == a.lease.token  # b stands by
    stop_a.set()
    await run_a  # a clean stop gives the lease up: b acts at its next try
    await _until(lambda: b.last is not None, timeout=5)
    stop_b.set()
    await run_b
    assert await a.lease.holder() is None


async def test_a_killed_planners_lease_lapses_and_a_successor_resumes_without_acting_at_once(redis, namespace) -> None:  # noqa: ANN001
    keys = Keys(namespace)
    for i in range(3):
        await put_worker(redis, keys, f"w{i}", usage=0.05)
    first = planner(redis, keys, lock_ttl_s=1.0)
    assert await first.lease.acquire()
    await first.step("interval")  # one interval that wanted fewer (1 of 2), kept in the state
    # Killed: no release. A successor stands by until the lease lapses, then resumes the count.
    second = planner(redis, keys, lock_ttl_s=1.0)
    assert not await second.lease.acquire()
    await asyncio.sleep(1.2)
    assert await second.lease.acquire()
    await second.resume()
    assert second.tick == 1 and second.memory[AGG].low == [1]
    decision = await second.step("interval")
    assert decision.tick == 2 and decision.pools[0].action == "down"  # the second low interval, not the first


async def test_a_planner_that_lost_its_lease_stops_acting(redis, namespace) -> None:  # noqa: ANN001
    keys = Keys(namespace)
    p = planner(redis, keys)
    assert await p.lease.acquire()
    await redis.set(keys.planner_leader, "someone else")
    assert not await p.lease.acquire()


async def _until(predicate, timeout: float = 5.0) -> None:  # noqa: ANN001
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.02)


@pytest.mark.parametrize("kind", ["constant", "moving_average", "arima", "kalman"])
async def test_every_predictor_kind_plans_from_the_observed_traffic(redis, namespace, kind: str) -> None:  # noqa: ANN001
    keys = Keys(namespace)
    p = planner(redis, keys, predictor=kind)
    forecaster = p.forecasters[MODEL]
    for rate in (1.0, 2.0, 3.0):
        forecaster.observe(rate, 100.0, 10.0)
    assert forecaster.forecast().rate > 0 and forecaster.forecast().isl > 0


async def test_a_successor_resumes_each_pools_last_shrink(redis, namespace) -> None:  # noqa: ANN001
    keys = Keys(namespace)
    p = planner(redis, keys)
    p.memory[AGG].last_down, p.memory[AGG].shrunk_from = 7, 3
    await p._save_state(100.0)
    successor = planner(redis, keys)
    await successor.resume()
    assert (successor.memory[AGG].last_down, successor.memory[AGG].shrunk_from) == (7, 3)


async def test_a_successor_resumes_the_decodes_context_and_an_older_state_without_it_reads(redis, namespace) -> None:  # noqa: ANN001
    keys = Keys(namespace)
    p = planner(redis, keys)
    p.forecasters[MODEL].observe(2.0, 1200, 100, 1050.0)
    p.forecasters[MODEL].observe(3.0, 1200, 100, 1000.0)
    await p._save_state(100.0)
    successor = planner(redis, keys)
    await successor.resume()
    assert successor.forecasters[MODEL].forecast() == Forecast(3.0, 1200, 100, 1000.0)
    # A state an older planner wrote has no contexts: those of one shape, the prompt and half the answer.
    state = decode_state(await redis.get(keys.planner_state))
    state.contexts = {}
    await redis.set(keys.planner_state, encode(state))
    older = planner(redis, keys)
    await older.resume()
    assert older.forecasters[MODEL].forecast() == Forecast(3.0, 1200, 100, 1250.0)


@pytest.mark.parametrize("up_band", [0.05, 0.0])
async def test_a_plan_a_few_hundredths_of_a_worker_over_the_pool_holds_it_within_the_up_band(
        redis, namespace, up_band: float) -> None:  # noqa: ANN001
    keys = Keys(namespace)
    for wid in ("w0", "w1"):
        await put_worker(redis, keys, wid, usage=0.05)
    publish = counters_publisher(FrontendRegistry(redis, keys))
    clock = [100.0]
    p = Planner(settings(mode="sla", itl_s=0.0625, ttft_s=1.0, interval_s=60.0, sure_shrink_z=0.0, up_band=up_band),
                [MODEL], redis, keys, VirtualConnector(redis, keys), profile=sla_profile(), clock=lambda: clock[0])
    await publish(0.0, 0, 0)
    await p.resume()

    async def interval(rate: float) -> PoolDecision:
        clock[0] += 60.0
        await publish(rate, 1000, 100)
        [pool] = (await p.step("interval")).pools
        return pool

    # 8.2 requests/s of 1,000 and 100 tokens need 2.06 aggregated workers: within 5% of 2, the pool holds.
    pool = await interval(8.2)
    assert pool.wanted == 3
    if up_band:
        assert (pool.action, pool.target) == ("hold", 2)
        assert "hold: needs 2.06 workers, within 5% of the 2 it has" in pool.reason
        # 8.8 requests/s need 2.21: past the band, it grows.
        pool = await interval(8.8)
    assert (pool.action, pool.target) == ("up", 3)
    # The load on the pool is a whole number of workers, which grows it past the band: with two of its three
    # workers at KV usage 0.8 the floor is 4 (the usage at which the ITL meets the target is 0.41, test_modes).
    for wid in ("w0", "w1", "w2"):
        await put_worker(redis, keys, wid, usage=0.8 if wid != "w2" else 0.0)
    pool = await interval(8.2)
    assert (pool.action, pool.target) == ("up", 4) and "kv usage" in pool.reason
