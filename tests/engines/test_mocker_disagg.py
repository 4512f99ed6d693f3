"""The mocker's two disaggregated roles (workers/engines/mocker/engine.py): a prefill that holds its blocks
for the read, and a decode that reads them instead of computing the prompt."""

from __future__ import annotations

import asyncio

import pytest

from core.messages import SamplingParams
from core.settings import MockerSettings
from workers.engines.base import EngineOutput, EngineRequest
from workers.engines.mocker.engine import MockerEngine

PROMPT = list(range(100, 1600))  # 1,500 tokens: 93 full blocks of 16 and a partial one
GREEDY = SamplingParams(max_tokens=20, temperature=0.0, seed=3, ignore_eos=True)
FIRST = SamplingParams(max_tokens=1, temperature=0.0, seed=3, ignore_eos=True)


async def _run(engine: MockerEngine, request: EngineRequest) -> tuple[list[int], EngineOutput]:
    tokens: list[int] = []
    last = None
    async for out in engine.generate(request):
        tokens += out.token_ids
        last = out
    assert last is not None
    return tokens, last


@pytest.fixture
async def engines():  # noqa: ANN201
    settings = MockerSettings(no_sleep=True, block_size=16, kv_blocks=512)
    made = [MockerEngine("m", settings, kv_hold_s=0.2) for _ in range(3)]
    for e in made:
        await e.start()
    yield made
    for e in made:
        await e.shutdown()


async def test_prefill_then_decode_gives_the_aggregated_tokens_and_moves_the_prompt(engines) -> None:  # noqa: ANN001
    agg, p, d = engines
    reference, ref_last = await _run(agg, EngineRequest("a", PROMPT, GREEDY))
    first, p_last = await _run(p, EngineRequest("r", PROMPT, FIRST, kv_export=True))
    assert p_last.kv_handle == {"engine": "mocker", "num_tokens": 1500, "block_size": 16}
    assert p.load().active_blocks == 94, "the prefill worker holds the prompt's blocks for the read"
    rest, d_last = await _run(d, EngineRequest("r", PROMPT + first, GREEDY, kv_handle=p_last.kv_handle,
                                               carried_tokens=1))
    assert first + rest == reference
    assert d_last.usage is not None and ref_last.usage is not None
    assert (d_last.usage.prompt_tokens, d_last.usage.completion_tokens) == (1500, 20)
    assert (d_last.usage.cached_tokens, d_last.usage.transferred_tokens) == (0, 1500)
    await p.release_transfer("r")
    assert p.load().active_blocks == 0 and d.load().active_blocks == 0
    # The decode worker now caches the prompt: a second read moves only the partial last block.
    again, d2 = await _run(d, EngineRequest("r2", PROMPT + first, GREEDY, kv_handle=p_last.kv_handle,
                                            carried_tokens=1))
    assert again == rest and d2.usage is not None
    assert (d2.usage.cached_tokens, d2.usage.transferred_tokens) == (1488, 12)


async def test_held_blocks_go_when_the_hold_ends(engines) -> None:  # noqa: ANN001
    _, p, _ = engines
    await _run(p, EngineRequest("r", PROMPT, FIRST, kv_export=True))
    assert p.load().active_blocks == 94
    for _ in range(100):
        if p.load().active_blocks == 0:
            break
        await asyncio.sleep(0.02)
    assert p.load().active_blocks == 0


async def test_aborting_a_decode_while_it_reads_frees_everything(engines) -> None:  # noqa: ANN001
    _, p, d = engines
    d.settings = d.settings.model_copy(update={"no_sleep": False, "transfer_gb_per_s": 0.001})  # a slow read
    first, p_last = await _run(p, EngineRequest("r", PROMPT, FIRST, kv_export=True))
    stream = d.generate(EngineRequest("r", PROMPT + first, GREEDY, kv_handle=p_last.kv_handle, carried_tokens=1))
    task = asyncio.ensure_future(stream.__anext__())
    await asyncio.sleep(0.05)
    await d.abort("r")
    out = await task
    assert out.finish_reason == "abort"
    assert d.load().active_blocks == 0 and d.load().waiting == 0
    await stream.aclose()
