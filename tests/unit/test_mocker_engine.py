"""The mocker engine beyond the shared contract: scheduling under pressure, errors, timing, faults.

Outputs are checked exactly against ``mocker_tokens.expected_output``; steps run without
sleeping (``no_sleep``) except in the timing test, which only asserts lower bounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from core.errors import ContextLengthExceeded, InvalidRequest, UpstreamError
from core.messages import AllBlocksCleared, SamplingParams
from core.settings import MockerSettings
from router.hashing import block_hashes, root_hash
from tests.support.kv_events import KvEventLog
from workers.engines.base import EngineOutput, EngineRequest, StepStats
from workers.engines.mocker.engine import MockerEngine
from workers.engines.mocker.request import Request
from workers.engines.mocker.scheduler import Scheduler
from workers.engines.mocker.timing import decode_ms, prefill_ms
from workers.engines.mocker.tokens import expected_output

MODEL = "mock-model"


@contextlib.asynccontextmanager
async def running(context_length: int = 8192, **settings: object) -> AsyncIterator[tuple[MockerEngine, KvEventLog]]:
    engine = MockerEngine(MODEL, MockerSettings(**{"no_sleep": True, **settings}), context_length=context_length)
    log = KvEventLog()
    await engine.start(log)
    try:
        yield engine, log
    finally:
        await engine.shutdown()


async def run(engine: MockerEngine, request_id: str, prompt: list[int], sampling: SamplingParams) -> list[EngineOutput]:
    return [out async for out in engine.generate(EngineRequest(request_id, prompt, sampling))]


def tokens_of(outputs: list[EngineOutput]) -> list[int]:
    return [t for out in outputs for t in out.token_ids]


def prompt(n: int, salt: int = 0) -> list[int]:
    return [100 + (salt * 7919 + i * 31) % 20000 for i in range(n)]


def spy(monkeypatch: pytest.MonkeyPatch, target: object, method: str) -> list[tuple]:
    """Record the arguments of every call to one of ``target``'s methods (the engine's scheduler's)."""
    calls: list[tuple] = []
    original = getattr(target, method)

    def record(*args: object) -> object:
        calls.append(args)
        return original(*args)

    monkeypatch.setattr(target, method, record)
    return calls


def assert_exact(engine: MockerEngine, p: list[int], sampling: SamplingParams, outputs: list[EngineOutput]) -> None:
    expected = expected_output(p, sampling, engine.info.vocab_size, engine.info.context_length)
    assert (tokens_of(outputs), outputs[-1].finish_reason) == expected


def assert_idle(engine: MockerEngine, log: KvEventLog) -> None:
    load = engine.load()
    assert (load.running, load.waiting, load.active_blocks) == (0, 0, 0)
    assert log.replay() == set(engine.cached_block_hashes())


async def test_info() -> None:
    async with running(context_length=4096, block_size=8, kv_blocks=100, max_num_seqs=7, vocab_size=1000) as (e, _):
        assert (e.info.engine, e.info.block_size, e.info.kv_blocks, e.info.max_num_seqs, e.info.vocab_size) == (
            "mocker", 8, 100, 7, 1000)
        assert e.info.context_length == 800  # capped by the KV cache: 100 blocks of 8


async def test_preemption_under_kv_pressure_keeps_outputs_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each request needs ceil((10 + 12 - 1) / 4) = 6 blocks; 8 blocks hold one at a time.
    async with running(block_size=4, kv_blocks=8) as (engine, log):
        preempted = spy(monkeypatch, engine._scheduler, "_preempt")
        sampling = SamplingParams(max_tokens=12, temperature=0.0)
        prompts = [prompt(10, salt) for salt in range(6)]
        results = await asyncio.gather(*(run(engine, f"r{i}", p, sampling) for i, p in enumerate(prompts)))
        for p, outputs in zip(prompts, results, strict=True):
            assert_exact(engine, p, sampling, outputs)
        assert preempted
        assert_idle(engine, log)


async def steps_of(settings: MockerSettings, requests: int) -> list[StepStats]:
    """The steps the engine reports while serving ``requests`` prompts of 10 tokens, 12 tokens each."""
    engine = MockerEngine(MODEL, settings)
    steps: list[StepStats] = []
    engine.on_step = steps.append
    await engine.start()
    try:
        sampling = SamplingParams(max_tokens=12, temperature=0.0)
        await asyncio.gather(*(run(engine, f"r{i}", prompt(10, i), sampling) for i in range(requests)))
    finally:
        await engine.shutdown()
    return steps


async def test_every_step_is_reported_with_its_tokens_and_time() -> None:
    steps = await steps_of(MockerSettings(no_sleep=True, block_size=4, speedup=2.0), requests=6)
    # Each prompt computed once; each request's first token sampled at the end of its prefill step.
    assert sum(s.prefill_tokens for s in steps) == 6 * 10
    assert sum(s.decode_tokens for s in steps) == 6 * 11
    assert sum(s.preemptions for s in steps) == 0
    first = steps[0]
    assert first.phase == "prefill" and first.duration_s == pytest.approx(prefill_ms(first.prefill_tokens) / 2000)
    assert steps[-1].phase == "decode" and steps[-1].prefill_tokens == 0
    assert all(s.duration_s is not None and s.duration_s > 0 for s in steps)


async def test_preemptions_are_reported_with_their_step(monkeypatch: pytest.MonkeyPatch) -> None:
    preempted: list[tuple] = []
    original = Scheduler._preempt

    def record(self: Scheduler, req: Request) -> None:
        preempted.append((req,))
        original(self, req)

    monkeypatch.setattr(Scheduler, "_preempt", record)
    steps = await steps_of(MockerSettings(no_sleep=True, block_size=4, kv_blocks=8), requests=6)
    assert sum(s.preemptions for s in steps) == len(preempted) > 0


async def test_chunked_prefill_and_cache_hits(monkeypatch: pytest.MonkeyPatch) -> None:
    async with running(block_size=4, max_num_batched_tokens=8) as (engine, log):
        computed = spy(monkeypatch, engine._scheduler, "_compute")
        sampling = SamplingParams(max_tokens=5, temperature=0.0)
        prompts = [prompt(50, salt) for salt in range(3)]
        results = await asyncio.gather(*(run(engine, f"r{i}", p, sampling) for i, p in enumerate(prompts)))
        for p, outputs in zip(prompts, results, strict=True):
            assert_exact(engine, p, sampling, outputs)
        assert max(chunk for _req, chunk in computed) == 8
        again = await run(engine, "again", prompts[0], sampling)
        assert_exact(engine, prompts[0], sampling, again)
        assert again[-1].usage is not None and again[-1].usage.cached_tokens == 48
        assert_idle(engine, log)


async def test_max_num_seqs_bounds_the_batch() -> None:
    async with running(max_num_seqs=2) as (engine, log):
        seen: list[int] = []

        async def watch() -> None:
            while True:
                seen.append(engine.load().running)
                await asyncio.sleep(0)

        watcher = asyncio.create_task(watch())
        sampling = SamplingParams(max_tokens=6, temperature=0.0)
        prompts = [prompt(9, salt) for salt in range(5)]
        results = await asyncio.gather(*(run(engine, f"r{i}", p, sampling) for i, p in enumerate(prompts)))
        watcher.cancel()
        for p, outputs in zip(prompts, results, strict=True):
            assert_exact(engine, p, sampling, outputs)
        assert max(seen) == 2
        assert_idle(engine, log)


async def test_a_full_prompt_is_never_all_cached() -> None:
    async with running(block_size=4) as (engine, _):
        p = prompt(8)
        await run(engine, "a", p, SamplingParams(max_tokens=2, temperature=0.0))
        outputs = await run(engine, "b", p, SamplingParams(max_tokens=2, temperature=0.0))
        assert outputs[-1].usage is not None and outputs[-1].usage.cached_tokens == 4


async def test_blocks_are_named_by_sluice_hashes_per_lora(tmp_path: Path) -> None:
    async with running(block_size=4) as (engine, _):
        (tmp_path / "adapter_config.json").write_text("{}")
        await engine.load_lora("adapter", str(tmp_path))
        p = prompt(9)
        sampling = SamplingParams(max_tokens=1, temperature=0.0)
        await run(engine, "a", p, sampling)
        out = [o async for o in engine.generate(EngineRequest("b", p, sampling, lora="adapter"))]
        assert out[-1].usage is not None and out[-1].usage.cached_tokens == 0
        cached = set(engine.cached_block_hashes())
        assert set(block_hashes(p, 4, root_hash(MODEL))) <= cached
        assert set(block_hashes(p, 4, root_hash(MODEL, "adapter"))) <= cached


async def test_generated_tokens_fill_blocks_too() -> None:
    async with running(block_size=4) as (engine, log):
        p = prompt(6)
        sampling = SamplingParams(max_tokens=7, temperature=0.0)
        outputs = await run(engine, "a", p, sampling)
        # KV is computed for the prompt and all but the last output token: 12 tokens, 3 blocks.
        full = p + tokens_of(outputs)
        assert engine.cached_block_hashes() == block_hashes(full[:12], 4, root_hash(MODEL))
        assert_idle(engine, log)


@pytest.mark.parametrize(
    ("settings", "tokens", "error"),
    [
        ({}, 4097, ContextLengthExceeded),  # longer than the context
        ({"kv_blocks": 10, "block_size": 4}, 41, ContextLengthExceeded),  # more blocks than the cache has
        ({}, 0, InvalidRequest),
    ],
)
async def test_requests_that_can_never_run_fail_at_once(settings: dict, tokens: int, error: type) -> None:
    async with running(context_length=4096, **settings) as (engine, _):
        with pytest.raises(error):
            await run(engine, "x", prompt(tokens), SamplingParams(max_tokens=1))
        assert engine.load().waiting == 0


async def test_bad_sampling_and_duplicate_ids_are_refused() -> None:
    async with running() as (engine, _):
        with pytest.raises(InvalidRequest):
            await run(engine, "x", prompt(4), SamplingParams(max_tokens=0))
        stream = engine.generate(EngineRequest("dup", prompt(4), SamplingParams(max_tokens=100)))
        await anext(stream)
        with pytest.raises(InvalidRequest):
            await run(engine, "dup", prompt(4), SamplingParams(max_tokens=1))
        await engine.abort("dup")
        assert (await anext(stream)).finish_reason == "abort"


async def test_a_consumer_that_leaves_releases_its_request() -> None:
    async with running() as (engine, log):
        async with contextlib.aclosing(engine.generate(EngineRequest("a", prompt(40), SamplingParams(max_tokens=999)))) as s:
            await anext(s)
            assert engine.load().active_blocks > 0
        assert_idle(engine, log)


async def test_abort_a_waiting_request() -> None:
    async with running(max_num_seqs=1) as (engine, log):
        first = engine.generate(EngineRequest("a", prompt(8), SamplingParams(max_tokens=999)))
        await anext(first)
        second = engine.generate(EngineRequest("b", prompt(8, 1), SamplingParams(max_tokens=999)))
        pending = asyncio.ensure_future(anext(second))
        await asyncio.sleep(0)
        assert engine.load().waiting == 1
        await engine.abort("b")
        out = await pending
        assert (out.token_ids, out.finish_reason) == ([], "abort")
        assert out.usage is not None and (out.usage.completion_tokens, out.usage.cached_tokens) == (0, 0)
        await engine.abort("a")
        assert_idle(engine, log)


async def test_clear_keeps_blocks_in_use_and_events_consistent() -> None:
    async with running(block_size=4) as (engine, log):
        await run(engine, "old", prompt(20, 1), SamplingParams(max_tokens=2, temperature=0.0))
        p = prompt(13)
        stream = engine.generate(EngineRequest("a", p, SamplingParams(max_tokens=999, temperature=0.0)))
        await anext(stream)
        await engine.clear_kv_cache()
        assert set(block_hashes(p, 4, root_hash(MODEL))) == set(engine.cached_block_hashes())
        assert log.replay() == set(engine.cached_block_hashes())
        await engine.abort("a")
        assert_idle(engine, log)


async def test_a_scheduler_fault_fails_requests_and_the_engine_recovers(monkeypatch: pytest.MonkeyPatch) -> None:
    async with running() as (engine, log):
        def broken(*_: object) -> None:
            raise RuntimeError("boom")

        monkeypatch.setattr(engine._scheduler, "_compute", broken)
        with pytest.raises(UpstreamError, match="boom"):
            await run(engine, "a", prompt(8), SamplingParams(max_tokens=3))
        assert isinstance(log.events[-1], AllBlocksCleared)
        monkeypatch.undo()
        sampling = SamplingParams(max_tokens=3, temperature=0.0)
        assert_exact(engine, prompt(8), sampling, await run(engine, "b", prompt(8), sampling))
        assert_idle(engine, log)


async def test_shutdown_aborts_everything() -> None:
    async with running() as (engine, _):
        streams = [engine.generate(EngineRequest(f"r{i}", prompt(8, i), SamplingParams(max_tokens=999))) for i in range(3)]
        for s in streams:
            await anext(s)
        await engine.shutdown()
        for s in streams:
            rest = [out async for out in s]
            assert rest[-1].finish_reason == "abort"
        with pytest.raises(UpstreamError):
            await run(engine, "late", prompt(8), SamplingParams(max_tokens=1))


async def test_unseeded_sampling_is_random() -> None:
    async with running() as (engine, _):
        sampling = SamplingParams(max_tokens=8, temperature=1.0)
        a = tokens_of(await run(engine, "a", prompt(8), sampling))
        b = tokens_of(await run(engine, "b", prompt(8), sampling))
        assert a != b


async def test_steps_take_at_least_their_modelled_time() -> None:
    # Lower bounds only: a loaded machine can make steps slower, never faster.
    async with running(no_sleep=False, speedup=2.0) as (engine, _):
        p = prompt(32)
        start = time.perf_counter()
        stream = engine.generate(EngineRequest("a", p, SamplingParams(max_tokens=10, temperature=0.0)))
        await anext(stream)
        ttft = time.perf_counter() - start
        _ = [out async for out in stream]
        total = time.perf_counter() - start
        assert ttft >= 0.95 * prefill_ms(32) / 2 / 1000
        assert total >= 0.95 * (prefill_ms(32) + 9 * decode_ms(0.0)) / 2 / 1000


async def test_simulations_can_read_the_cache_hit_and_pending_prefill() -> None:
    """What the routing benchmark's oracle reads: the hit a prompt would get now (whole blocks, the last
    prompt token always computed) and the prompt tokens not computed yet."""
    async with running(block_size=4, kv_blocks=512, max_num_seqs=1) as (engine, _):
        first = prompt(22)
        assert engine.prompt_hit_tokens(first) == 0
        assert engine.pending_prefill_tokens() == 0
        await run(engine, "a", first, SamplingParams(max_tokens=1, ignore_eos=True))
        assert engine.prompt_hit_tokens(first) == 20  # 5 whole blocks of the 22 tokens
        assert engine.prompt_hit_tokens(first[:20]) == 16  # its last token is computed, so 4 blocks
        assert engine.prompt_hit_tokens(first + prompt(9, salt=1)) == 20
        assert engine.prompt_hit_tokens(first, lora="other") == 0  # another chain
        # One sequence at a time: a request that decodes until aborted keeps the next one waiting.
        busy = asyncio.ensure_future(run(engine, "busy", prompt(8, salt=3), SamplingParams(max_tokens=1500,
                                                                                        ignore_eos=True)))
        waiting = asyncio.ensure_future(run(engine, "waiting", prompt(10, salt=2), SamplingParams(max_tokens=1)))
        async with asyncio.timeout(10):
            while engine.load().running == 0 or engine.load().waiting == 0:
                await asyncio.sleep(0)
        assert engine.pending_prefill_tokens() == 10  # "busy" is decoding; "waiting" has computed nothing
        await engine.abort("busy")
        await asyncio.gather(busy, waiting)
        assert engine.pending_prefill_tokens() == 0
