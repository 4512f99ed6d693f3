"""What a simulation's reference policy may ask a mocker about its KV tiers (MockerEngine.prompt_tier_read,
bench.oracle_policy's ``oracle, tiers``): the tokens its tiers would onboard past the device cache's hit, and
how long that read takes in model time, without reading anything."""

from __future__ import annotations

import random

import pytest

from bench.devstack import RedisServer
from bench.oracle_policy import TtftOracle
from core.messages import SamplingParams
from core.settings import KvbmSettings, MockerSettings
from tests.engines.conftest import EngineCase
from tests.engines.test_conformance import collect
from tests.engines.test_tier_conformance import DEVICE_BLOCKS, GREEDY, MODEL, _chain, _evict
from tests.support.kv_events import KvEventLog
from workers.engines.mocker.engine import MockerEngine
from workers.engines.mocker.tiers import MockerTiers
from workers.kvbm.frame import frame_size
from workers.kvbm.tiers import KvTiers

#: Model time runs 1,000 times faster than real time: reads and steps take a few real milliseconds.
SETTINGS = MockerSettings(speedup=1000.0, kv_blocks=DEVICE_BLOCKS, block_size=16, kv_bytes_per_block=4096)


async def _engine(kvbm: KvbmSettings | None) -> EngineCase:
    log = KvEventLog()
    tiers = None
    if kvbm is not None:
        store = KvTiers(kvbm, scope=f"{MODEL}-peek", block_bytes=SETTINGS.kv_bytes_per_block, inline=True)
        tiers = MockerTiers(store, SETTINGS, kvbm)
    engine = MockerEngine(MODEL, SETTINGS, context_length=4096, tiers=tiers)
    await engine.start(log)
    return EngineCase("mocker", engine, log)


@pytest.fixture
def shared_redis():  # noqa: ANN201
    server = RedisServer().start()
    yield server
    server.stop()


async def test_an_engine_without_tiers_would_onboard_nothing() -> None:
    case = await _engine(None)
    try:
        prompt = case.prompt(5 * 16 + 3)
        await collect(case, prompt, GREEDY)
        assert isinstance(case.engine, MockerEngine)
        assert case.engine.prompt_tier_read(prompt) == (0, 0.0)
        assert case.engine.prompt_hit_tokens(prompt) == 5 * 16
    finally:
        await case.engine.shutdown()


async def test_an_evicted_prompt_is_read_from_the_host_tier_then_from_the_shared_one(shared_redis: RedisServer) -> None:
    """Evicted from the device, a prompt's blocks are in the host tier; emptied from there, the shared tier
    still holds them; each read takes the tiers' simulated time; once onboarded, the device holds them."""
    kvbm = KvbmSettings(host_bytes=4 * DEVICE_BLOCKS * frame_size(4096), timeout_ms=2000,
                        redis_url=shared_redis.url.replace("/0", "/1"))
    case = await _engine(kvbm)
    engine = case.engine
    assert isinstance(engine, MockerEngine) and engine.tiers is not None
    try:
        prompt = case.prompt(6 * 16 + 3)
        chain = _chain(case, prompt)
        await collect(case, prompt, GREEDY)
        assert engine.tiers.store.flush()
        await _evict(case, chain)
        assert engine.prompt_hit_tokens(prompt) == 0
        tokens, seconds = engine.prompt_tier_read(prompt)
        assert tokens == 6 * 16
        assert seconds == pytest.approx(engine.tiers.simulated_s(["host"] * 6)) and seconds > 0

        assert engine.tiers.store.host is not None
        engine.tiers.store.host.clear()
        tokens, seconds = engine.prompt_tier_read(prompt)
        assert tokens == 6 * 16
        assert seconds == pytest.approx(engine.tiers.simulated_s(["shared"] * 6))
        assert seconds > engine.tiers.simulated_s(["host"] * 6)  # the shared tier is the slower read

        oracle = TtftOracle({"w": engine}, rng=random.Random(0), tiers=True)
        blind = TtftOracle({"w": engine}, rng=random.Random(0))
        assert oracle.predicted_ms(engine, prompt, None) < blind.predicted_ms(engine, prompt, None)

        again = await collect(case, prompt, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
        assert again[-1].usage is not None and again[-1].usage.cached_tokens == 6 * 16
        assert engine.prompt_hit_tokens(prompt) == 6 * 16
        assert engine.prompt_tier_read(prompt) == (0, 0.0)  # nothing left past the device's hit
    finally:
        await engine.shutdown()
