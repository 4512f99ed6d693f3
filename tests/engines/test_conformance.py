"""The engine contract (workers/engines/base.py), checked against every engine in conftest.ENGINES.

Expectations come from the engine itself (a first greedy run, its own ``info`` and ``load()``),
never from absolute timings, so the tests hold for a simulated and for a real engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable

import pytest

from core.errors import ContextLengthExceeded, InvalidRequest, SluiceError
from core.messages import SamplingParams
from router.hashing import block_hashes, root_hash
from tests.engines.conftest import EngineCase
from tests.support.kv_events import PrefixClosureChecker
from workers.engines.base import EngineOutput, EngineRequest, StepStats

GREEDY = SamplingParams(max_tokens=8, temperature=0.0)
TIMEOUT_S = 60


def greedy_to_length(max_tokens: int) -> SamplingParams:
    """Greedy, and never ended early by the model's end-of-sequence token: ends with "length"."""
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def new_id(kind: str = "conf") -> str:
    return f"{kind}-{uuid.uuid4().hex[:12]}"


async def collect(case: EngineCase, prompt: list[int], sampling: SamplingParams) -> list[EngineOutput]:
    return await run(case, EngineRequest(new_id(), prompt, sampling))


async def run(case: EngineCase, request: EngineRequest) -> list[EngineOutput]:
    return await asyncio.wait_for(_drain(case.engine.generate(request)), TIMEOUT_S)


def tokens_of(outputs: list[EngineOutput]) -> list[int]:
    return [t for out in outputs for t in out.token_ids]


async def eventually(check: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    """Whether ``check`` holds now or within ``timeout_s`` (events may reach the sink late)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


async def test_outputs_are_ordered_and_complete(engine: EngineCase) -> None:
    prompt = engine.prompt(20)
    outputs = await collect(engine, prompt, GREEDY)
    assert [out.finish_reason is not None for out in outputs] == [False] * (len(outputs) - 1) + [True]
    assert all(out.usage is None for out in outputs[:-1])
    last = outputs[-1]
    assert last.usage is not None
    assert last.usage.completion_tokens == len(tokens_of(outputs))
    if engine.expected is not None:
        assert (tokens_of(outputs), last.finish_reason) == engine.expected(prompt, GREEDY)


async def test_max_tokens_finishes_with_length(engine: EngineCase) -> None:
    sampling = SamplingParams(max_tokens=5, temperature=0.0)
    outputs = await collect(engine, engine.prompt(12), sampling)
    assert outputs[-1].finish_reason == "length"
    assert len(tokens_of(outputs)) == 5


async def test_stop_token_finishes_with_stop_and_is_included(engine: EngineCase) -> None:
    prompt = engine.prompt(16)
    free_run = tokens_of(await collect(engine, prompt, SamplingParams(max_tokens=12, temperature=0.0)))
    stop = free_run[5]
    first = free_run.index(stop)
    outputs = await collect(engine, prompt, SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=(stop,)))
    assert tokens_of(outputs) == free_run[: first + 1]
    assert outputs[-1].finish_reason == "stop"


async def test_min_tokens_holds_stop_tokens_back(engine: EngineCase) -> None:
    prompt = engine.prompt(16)
    free_run = tokens_of(await collect(engine, prompt, SamplingParams(max_tokens=12, temperature=0.0)))
    stop = free_run[0]
    sampling = SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=(stop,), min_tokens=4)
    outputs = await collect(engine, prompt, sampling)
    out = tokens_of(outputs)
    assert len(out) >= 4
    assert stop not in out[:4]
    assert outputs[-1].finish_reason == ("stop" if out[-1] == stop else "length")


async def test_greedy_and_seeded_sampling_are_reproducible(engine: EngineCase) -> None:
    prompt = engine.prompt(24)
    greedy = [tokens_of(await collect(engine, prompt, GREEDY)) for _ in range(2)]
    assert greedy[0] == greedy[1]
    greedy_seeded = tokens_of(await collect(engine, prompt, SamplingParams(max_tokens=8, temperature=0.0, seed=99)))
    assert greedy_seeded == greedy[0]
    seeded = SamplingParams(max_tokens=8, temperature=1.0, seed=1234)
    assert tokens_of(await collect(engine, prompt, seeded)) == tokens_of(await collect(engine, prompt, seeded))


async def test_usage_is_exact(engine: EngineCase) -> None:
    prompt = engine.prompt(37)
    outputs = await collect(engine, prompt, SamplingParams(max_tokens=7, temperature=0.0))
    usage = outputs[-1].usage
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (37, 7)
    assert usage.cached_tokens == 0  # a prompt never seen before


async def test_repeated_prompt_hits_the_prefix_cache(engine: EngineCase) -> None:
    block_size = engine.engine.info.block_size
    prompt = engine.prompt(4 * block_size + 3)
    await collect(engine, prompt, GREEDY)
    outputs = await collect(engine, prompt, GREEDY)
    usage = outputs[-1].usage
    assert usage is not None
    assert 0 < usage.cached_tokens < len(prompt)
    assert usage.cached_tokens % block_size == 0


async def test_abort_ends_the_stream_and_frees_blocks(engine: EngineCase) -> None:
    baseline = engine.engine.load().active_blocks
    request = EngineRequest(f"conf-abort-{uuid.uuid4().hex[:8]}", engine.prompt(40),
                            SamplingParams(max_tokens=1000, temperature=0.0))
    stream = engine.engine.generate(request)
    first = await asyncio.wait_for(anext(stream), TIMEOUT_S)
    assert first.finish_reason is None
    assert engine.engine.load().active_blocks > baseline
    await engine.engine.abort(request.request_id)
    assert engine.engine.load().active_blocks == baseline
    rest = await asyncio.wait_for(_drain(stream), 5)
    assert rest[-1].finish_reason == "abort"
    usage = rest[-1].usage
    assert usage is not None
    assert usage.completion_tokens == len(first.token_ids) + len(tokens_of(rest))
    await engine.engine.abort(request.request_id)  # finished: a no-op
    await engine.engine.abort("conf-never-seen")  # unknown: a no-op


async def _drain(stream: AsyncIterator[EngineOutput]) -> list[EngineOutput]:
    return [out async for out in stream]


def assert_idle(case: EngineCase, active_blocks: int) -> None:
    load = case.engine.load()
    assert (load.running, load.waiting, load.active_blocks) == (0, 0, active_blocks)


async def test_a_duplicate_request_id_is_refused_and_the_live_request_goes_on(engine: EngineCase) -> None:
    baseline = engine.engine.load().active_blocks
    prompt = engine.prompt(24)
    sampling = greedy_to_length(12)
    request = EngineRequest(new_id("conf-dup"), prompt, sampling)
    async with contextlib.aclosing(engine.engine.generate(request)) as stream:
        head = await asyncio.wait_for(anext(stream), TIMEOUT_S)
        with pytest.raises(InvalidRequest):
            await run(engine, EngineRequest(request.request_id, engine.prompt(8), sampling))
        outputs = [head, *await asyncio.wait_for(_drain(stream), TIMEOUT_S)]
    assert outputs[-1].finish_reason == "length"
    assert len(tokens_of(outputs)) == 12
    if engine.expected is not None:
        assert (tokens_of(outputs), "length") == engine.expected(prompt, sampling)
    assert_idle(engine, baseline)


async def test_closing_the_iterator_early_frees_the_requests_blocks(engine: EngineCase) -> None:
    baseline = engine.engine.load().active_blocks
    request = EngineRequest(new_id("conf-close"), engine.prompt(40), greedy_to_length(1000))
    async with contextlib.aclosing(engine.engine.generate(request)) as stream:
        async for out in stream:
            assert out.finish_reason is None
            assert engine.engine.load().active_blocks > baseline
            break
    assert_idle(engine, baseline)
    # The request is gone, not merely unread: its id may be used again.
    again = await run(engine, EngineRequest(request.request_id, engine.prompt(8), greedy_to_length(2)))
    assert again[-1].finish_reason == "length"


async def test_a_dropped_iterator_is_closed_and_frees_the_requests_blocks(engine: EngineCase) -> None:
    baseline = engine.engine.load().active_blocks
    request = EngineRequest(new_id("conf-drop"), engine.prompt(40), greedy_to_length(1000))
    stream = engine.engine.generate(request)
    first = await asyncio.wait_for(anext(stream), TIMEOUT_S)
    assert first.finish_reason is None
    del stream  # unclosed: the event loop's async-generator finalizer closes it

    def idle() -> bool:
        load = engine.engine.load()
        return (load.running, load.waiting, load.active_blocks) == (0, 0, baseline)

    assert await eventually(idle, TIMEOUT_S)


async def _ending(stream: AsyncIterator[EngineOutput]) -> str:
    """How a stream ends: its last finish reason, or "error" when it raises a SluiceError."""
    try:
        outputs = await asyncio.wait_for(_drain(stream), TIMEOUT_S)
    except SluiceError:
        return "error"
    return str(outputs[-1].finish_reason)


async def test_shutdown_ends_the_running_requests(own_engine: EngineCase) -> None:
    engine = own_engine.engine
    sampling = greedy_to_length(1000)
    streams = [engine.generate(EngineRequest(new_id("conf-stop"), own_engine.prompt(16), sampling)) for _ in range(3)]
    for stream in streams[:2]:
        first = await asyncio.wait_for(anext(stream), TIMEOUT_S)
        assert first.finish_reason is None
    submitted = asyncio.ensure_future(anext(streams[2]))  # handed to the engine, no output yet
    await asyncio.sleep(0)

    await asyncio.wait_for(engine.shutdown(), TIMEOUT_S)

    for stream in streams[:2]:
        assert await _ending(stream) in ("abort", "error")
    try:
        first = await asyncio.wait_for(submitted, TIMEOUT_S)
        ending = str(first.finish_reason) if first.finish_reason is not None else await _ending(streams[2])
    except SluiceError:
        ending = "error"
    assert ending in ("abort", "error")
    with pytest.raises(SluiceError):
        await collect(own_engine, own_engine.prompt(8), SamplingParams(max_tokens=1))


async def test_concurrent_requests_are_batched(engine: EngineCase) -> None:
    """Concurrent requests share the engine's steps: some step decodes most of them at once. Read from the
    engine's own step reports (``on_step``), not from timings, which a busy machine distorts (served one
    after the other, every step would decode one request)."""
    n = 8
    sampling = SamplingParams(max_tokens=16, temperature=0.0)
    steps: list[StepStats] = []
    previous = engine.engine.on_step

    def observe(step: StepStats) -> None:
        steps.append(step)
        if previous is not None:
            previous(step)

    engine.engine.on_step = observe
    try:
        results = await asyncio.gather(*(collect(engine, engine.prompt(24), sampling) for _ in range(n)))
    finally:
        engine.engine.on_step = previous
    assert all(len(tokens_of(r)) == 16 for r in results)
    assert max((s.decode_tokens for s in steps), default=0) >= n // 2, [s.decode_tokens for s in steps]


async def test_kv_events_match_the_cached_blocks(engine: EngineCase) -> None:
    info = engine.engine.info
    prompts = [engine.prompt(3 * info.block_size + 5) for _ in range(3)]
    await asyncio.gather(*(collect(engine, p, GREEDY) for p in prompts))
    cached = set(engine.engine.cached_block_hashes())
    root = root_hash(info.model)
    for p in prompts:
        assert set(block_hashes(p, info.block_size, root)) <= cached
    assert await eventually(lambda: engine.kv_events.replay() == set(engine.engine.cached_block_hashes()))


async def test_clear_kv_cache_is_reported(engine: EngineCase) -> None:
    await collect(engine, engine.prompt(2 * engine.engine.info.block_size + 1), GREEDY)
    assert engine.engine.cached_block_hashes()
    await engine.engine.clear_kv_cache()
    assert engine.engine.cached_block_hashes() == []
    assert await eventually(lambda: engine.kv_events.replay() == set())


async def test_clearing_while_a_request_holds_blocks(engine: EngineCase) -> None:
    info = engine.engine.info
    baseline = engine.engine.load().active_blocks
    unused = engine.prompt(3 * info.block_size + 1)
    await collect(engine, unused, GREEDY)
    unused_blocks = set(block_hashes(unused, info.block_size, root_hash(info.model)))
    assert await eventually(lambda: unused_blocks <= set(engine.engine.cached_block_hashes()))

    prompt = engine.prompt(3 * info.block_size + 5)
    sampling = greedy_to_length(24)
    async with contextlib.aclosing(engine.engine.generate(EngineRequest(new_id("conf-clear"), prompt, sampling))) as stream:
        head = await asyncio.wait_for(anext(stream), TIMEOUT_S)
        assert head.finish_reason is None
        await asyncio.wait_for(engine.engine.clear_kv_cache(), TIMEOUT_S)  # never refused while requests run
        assert not unused_blocks & set(engine.engine.cached_block_hashes())
        outputs = [head, *await asyncio.wait_for(_drain(stream), TIMEOUT_S)]

    # The running request went on to its end, its output unchanged.
    assert outputs[-1].finish_reason == "length"
    assert len(tokens_of(outputs)) == 24
    if engine.expected is not None:
        assert (tokens_of(outputs), "length") == engine.expected(prompt, sampling)
    assert_idle(engine, baseline)
    # The events say what stays cached, and the unused blocks are really gone.
    assert await eventually(lambda: engine.kv_events.replay() == set(engine.engine.cached_block_hashes()))
    rerun = (await collect(engine, unused, GREEDY))[-1].usage
    assert rerun is not None and rerun.cached_tokens == 0


@pytest.mark.parametrize("prompt_len", [1, 2])
async def test_tiny_prompts(engine: EngineCase, prompt_len: int) -> None:
    outputs = await collect(engine, engine.prompt(prompt_len), SamplingParams(max_tokens=3, temperature=0.0))
    usage = outputs[-1].usage
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, outputs[-1].finish_reason) == (prompt_len, 3, "length")


async def test_bad_prompts_are_refused_with_the_reason(engine: EngineCase) -> None:
    limit = engine.engine.info.context_length
    with pytest.raises(ContextLengthExceeded, match=str(limit)):
        await collect(engine, engine.prompt(limit + 1), SamplingParams(max_tokens=1))
    with pytest.raises(InvalidRequest):
        await collect(engine, [], SamplingParams(max_tokens=1))
    load = engine.engine.load()
    assert load.running == load.waiting == 0
    outputs = await collect(engine, engine.prompt(8), SamplingParams(max_tokens=2, temperature=0.0))
    assert outputs[-1].finish_reason == "length"


async def _one_and_close(case: EngineCase, prompt: list[int]) -> None:
    """Start a request and leave after its first output (its blocks, some of a chain, go back)."""
    request = EngineRequest(new_id("conf-chain"), prompt, greedy_to_length(64))
    async with contextlib.aclosing(case.engine.generate(request)) as stream:
        await asyncio.wait_for(anext(stream), TIMEOUT_S)


async def test_cached_blocks_stay_prefix_closed_through_evictions(engine: EngineCase) -> None:
    """The prefix index's search relies on it (router.prefix_index): a worker holding a block holds its
    parent. Waves of concurrent requests on a few shared prefixes, with long private suffixes, some
    generated blocks, a request left early per wave and earlier prompts asked again, until the cache
    has evicted for a while; every batch of events the engine reported (this test's and all earlier
    ones) is replayed and the held set checked after each."""
    info = engine.engine.info
    bs = info.block_size
    out_tokens = bs + 2  # the output fills a block: generated blocks extend the chains
    prefix_len = 4 * bs
    # Private suffixes of about 1/16 of the cache each (at most 192 blocks): a wave of 8 fills half of it,
    # so the cache evicts from the third wave on, whatever its size (a CPU vLLM computes a wave in seconds).
    suffix_len = min(info.context_length - prefix_len - out_tokens - 1, max(1, min(192, info.kv_blocks // 16)) * bs)
    assert suffix_len >= bs, "the context is too short for this test"
    per_request_blocks = (prefix_len + suffix_len + out_tokens) // bs
    # Enough waves for the private suffixes to overflow the cache about three times.
    max_waves = 3 * info.kv_blocks // (8 * per_request_blocks) + 3
    prefixes = [engine.prompt(prefix_len) for _ in range(4)]
    seen: list[list[int]] = []
    log_start = len(engine.kv_events.batches())
    hits = 0
    evicting_waves = 0
    for wave in range(max_waves):
        prompts = [prefixes[(wave + i) % 4] + engine.prompt(suffix_len) for i in range(7)]
        again = [seen[(wave * 5 + k) % len(seen)] for k in range(2)] if seen else []
        results = await asyncio.gather(
            *(collect(engine, p, greedy_to_length(out_tokens)) for p in [*prompts, *again]),
            _one_and_close(engine, prefixes[wave % 4] + engine.prompt(suffix_len)))
        for outputs in results[:-1]:
            usage = outputs[-1].usage
            assert usage is not None
            hits += usage.cached_tokens >= prefix_len
        seen += prompts
        checker = PrefixClosureChecker().replay(engine.kv_events.batches()[log_start:])
        if checker.removed:
            evicting_waves += 1
            if evicting_waves >= 3:
                break
    assert evicting_waves >= 3, f"no evictions after {max_waves} waves: the workload is too small for the cache"
    assert hits > 0, "no request reused a shared prefix"
    # Every batch since the engine started, this test's included (raises at the first broken batch).
    checker = PrefixClosureChecker().replay(engine.kv_events.batches())
    assert checker.removed and checker.stored
    assert await eventually(lambda: engine.kv_events.replay() == set(engine.engine.cached_block_hashes()))
