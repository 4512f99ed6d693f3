"""KV tiers (workers/kvbm), checked against every engine that has them: blocks the cache evicts live on
below it, a prompt that comes back is onboarded instead of recomputed, budgets hold, and a corrupt block
or a tier that is down costs a recompute, never an error.

Engine-agnostic: what the tiers hold is read from the engine's KV events (as the router reads it), what
was onboarded from ``usage.cached_tokens``, and correctness from a greedy rerun's output. Each test starts
its own engine with a small device cache, so a few prompts evict the first one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Protocol

import pytest

from bench.devstack import RedisServer, free_port
from core.messages import BlockRemoved, SamplingParams
from core.settings import KvbmSettings, MockerSettings
from router.hashing import block_hashes, root_hash
from tests.engines.conftest import EngineCase
from tests.engines.test_conformance import collect, eventually, tokens_of
from tests.support.kv_events import KvEventLog, PrefixClosureChecker
from workers.engines.base import Engine, EngineOutput, KvEventSink
from workers.engines.mocker.engine import MockerEngine
from workers.engines.mocker.tiers import MockerTiers
from workers.kvbm.frame import frame_size
from workers.kvbm.tiers import KvTiers

MODEL = "tier-model"
GREEDY = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
#: The device cache of the engines under test, in blocks.
DEVICE_BLOCKS = 32

StartTiered = Callable[[KvEventSink, KvbmSettings, bool], Awaitable[tuple[Engine, int]]]


async def _start_mocker(sink: KvEventSink, kvbm: KvbmSettings, stepwise: bool) -> tuple[Engine, int]:
    """A mocker with a small cache and the given tiers; returns it and its KV bytes per block. ``stepwise``:
    the tiers write within the engine's step (no offload thread), so each step's tier changes are one batch
    of events, whatever the machine's speed."""
    settings = MockerSettings(no_sleep=True, kv_blocks=DEVICE_BLOCKS, block_size=16, kv_bytes_per_block=4096)
    store = KvTiers(kvbm, scope=f"{MODEL}-mocker-16", block_bytes=settings.kv_bytes_per_block, inline=stepwise)
    engine = MockerEngine(MODEL, settings, context_length=4096, tiers=MockerTiers(store, settings, kvbm))
    await engine.start(sink)
    return engine, settings.kv_bytes_per_block


TIERED_ENGINES: dict[str, StartTiered] = {"mocker": _start_mocker}
class TieredFactory(Protocol):
    def __call__(self, kvbm: KvbmSettings, *, stepwise: bool = False) -> Awaitable[tuple[EngineCase, int]]: ...


@pytest.fixture(params=list(TIERED_ENGINES))
async def tiered(request: pytest.FixtureRequest) -> AsyncIterator[TieredFactory]:
    """Starts engines of one kind with the tiers a test asks for; shuts them all down after it."""
    started: list[Engine] = []

    async def start(kvbm: KvbmSettings, *, stepwise: bool = False) -> tuple[EngineCase, int]:
        log = KvEventLog()
        engine, block_bytes = await TIERED_ENGINES[request.param](log, kvbm, stepwise)
        started.append(engine)
        return EngineCase(request.param, engine, log), block_bytes

    yield start
    for engine in started:
        await engine.shutdown()


def _kvbm(**kw: object) -> KvbmSettings:
    return KvbmSettings.model_validate({"timeout_ms": 2000, **kw})


def _chain(case: EngineCase, prompt: list[int]) -> list[int]:
    """The prompt's full blocks' hashes, as the router names them."""
    bs = case.engine.info.block_size
    return block_hashes(prompt, bs, root_hash(MODEL, None))[: (len(prompt) - 1) // bs]


async def _evict(case: EngineCase, chain: list[int]) -> None:
    """Run other prompts until the cache has evicted the chain's first block."""
    bs = case.engine.info.block_size
    for _ in range(20):
        if chain[0] not in case.kv_events.replay():
            return
        await collect(case, case.prompt(DEVICE_BLOCKS * bs // 2), GREEDY)
    raise AssertionError("the cache never evicted the first prompt")


def _cached(outputs: list[EngineOutput]) -> int:
    usage = outputs[-1].usage
    assert usage is not None
    return usage.cached_tokens


async def test_blocks_the_cache_evicts_live_on_in_the_host_tier_and_come_back_onboarded(tiered: TieredFactory) -> None:
    case, block_bytes = await tiered(_kvbm(host_bytes=4 * DEVICE_BLOCKS * frame_size(4096)))
    bs = case.engine.info.block_size
    prompt = case.prompt(6 * bs + 3)
    chain = _chain(case, prompt)
    first = await collect(case, prompt, GREEDY)
    assert await eventually(lambda: set(chain) <= case.kv_events.replay("host"))
    await _evict(case, chain)
    assert set(chain) <= case.kv_events.replay("host")  # offloaded, still there after the eviction
    again = await collect(case, prompt, GREEDY)
    assert tokens_of(again) == tokens_of(first)
    assert _cached(again) == len(chain) * bs  # every full block onboarded, none recomputed


async def test_the_host_budget_holds_and_one_off_prompts_do_not_flush_a_hot_prefix(tiered: TieredFactory) -> None:
    capacity = 24
    case, block_bytes = await tiered(_kvbm(host_bytes=capacity * frame_size(4096)))
    bs = case.engine.info.block_size
    hot = case.prompt(4 * bs + 1)
    hot_chain = _chain(case, hot)
    for _ in range(3):  # a prefix many requests share
        await collect(case, hot + case.prompt(bs), GREEDY)
    for _ in range(6):  # long one-off prompts, more than the host tier holds
        await collect(case, case.prompt(10 * bs), GREEDY)
        assert len(case.kv_events.replay("host")) <= capacity
    assert await eventually(lambda: set(hot_chain) <= case.kv_events.replay("host"))


async def test_a_corrupt_block_is_recomputed_from_there_with_the_same_output(tiered: TieredFactory, tmp_path: Path) -> None:
    case, block_bytes = await tiered(_kvbm(disk_dir=str(tmp_path), disk_bytes=256 * frame_size(4096)))
    bs = case.engine.info.block_size
    prompt = case.prompt(6 * bs + 3)
    chain = _chain(case, prompt)
    first = await collect(case, prompt, GREEDY)
    assert await eventually(lambda: set(chain) <= case.kv_events.replay("disk"))
    await _evict(case, chain)
    damaged = next(tmp_path.rglob(f"{chain[2] & ((1 << 64) - 1):016x}-*.kv"))
    data = bytearray(damaged.read_bytes())
    data[-1] ^= 0xFF
    damaged.write_bytes(bytes(data))
    again = await collect(case, prompt, GREEDY)
    assert tokens_of(again) == tokens_of(first)
    assert _cached(again) == 2 * bs  # the two blocks before the corrupt one; the rest recomputed
    assert any(isinstance(e, BlockRemoved) and e.tier == "disk" and set(chain[2:]) <= set(e.block_hashes)
               for e in case.kv_events.events)  # the damaged block and those after it left the tier, and said so


async def test_a_shared_tier_that_is_down_costs_a_recompute_not_an_error(tiered: TieredFactory) -> None:
    case, _ = await tiered(_kvbm(redis_url=f"redis://127.0.0.1:{free_port()}/0", timeout_ms=200))
    bs = case.engine.info.block_size
    prompt = case.prompt(6 * bs + 3)
    chain = _chain(case, prompt)
    first = await collect(case, prompt, GREEDY)
    await _evict(case, chain)
    again = await collect(case, prompt, GREEDY)
    assert tokens_of(again) == tokens_of(first)
    assert _cached(again) == 0


async def test_any_engine_onboards_what_another_offloaded_to_the_shared_tier(
        tiered: TieredFactory, redis_server: RedisServer, namespace: str) -> None:
    kvbm = _kvbm(redis_url=redis_server.url)
    writer, _ = await tiered(kvbm)
    reader, _ = await tiered(kvbm)
    bs = writer.engine.info.block_size
    prompt = writer.prompt(6 * bs + 3) + [int(namespace[-4:], 16) % 1000 + 2000]  # a prompt of this test alone
    chain = _chain(writer, prompt)
    first = await collect(writer, prompt, GREEDY)
    assert await eventually(lambda: set(chain) <= writer.kv_events.replay("shared"))
    again = await collect(reader, prompt, GREEDY)
    assert tokens_of(again) == tokens_of(first)
    assert _cached(again) == len(chain) * bs


async def test_a_restarted_engine_serves_a_known_prompt_from_its_disk_tier(tiered: TieredFactory, tmp_path: Path) -> None:
    kvbm = _kvbm(disk_dir=str(tmp_path), disk_bytes=256 * frame_size(4096))
    before, _ = await tiered(kvbm)
    bs = before.engine.info.block_size
    prompt = before.prompt(6 * bs + 3)
    chain = _chain(before, prompt)
    first = await collect(before, prompt, GREEDY)
    assert await eventually(lambda: set(chain) <= before.kv_events.replay("disk"))
    await before.engine.shutdown()
    after, _ = await tiered(kvbm)
    assert set(chain) <= set(after.engine.tier_block_hashes()["disk"])
    assert await eventually(lambda: set(chain) <= after.kv_events.replay("disk"))  # announced at start
    again = await collect(after, prompt, GREEDY)
    assert tokens_of(again) == tokens_of(first)
    assert _cached(again) == len(chain) * bs


async def test_every_tier_stays_prefix_closed_through_evictions(tiered: TieredFactory, tmp_path: Path) -> None:
    """The router's invariant (router/prefix_index.py), checked after every batch of the engine's events,
    for each tier as for its cache: prompts that share prefixes, more than the tiers hold."""
    case, _ = await tiered(_kvbm(host_bytes=20 * frame_size(4096), disk_dir=str(tmp_path),
                                 disk_bytes=40 * frame_size(4096)), stepwise=True)
    bs = case.engine.info.block_size
    prefixes = [case.prompt(3 * bs) for _ in range(3)]
    for i in range(12):
        await collect(case, prefixes[i % 3] + case.prompt((i % 4 + 2) * bs + 1), GREEDY)
        if i % 5 == 4:
            await collect(case, prefixes[0] + case.prompt(bs), GREEDY)  # a hot prefix comes back
    for tier in ("device", "host", "disk"):
        checker = PrefixClosureChecker(tier).replay(case.kv_events.batches())  # raises at a violation
        assert checker.stored > 0 and checker.removed > 0, f"the {tier} tier saw no eviction"
