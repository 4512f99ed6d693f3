"""The vLLM engine against the real default model (SmolLM2-135M-Instruct, float32 on CPU).

The engine is the session's shared one (start-up takes about a minute on CPU): the conformance
suite (tests/engines/test_conformance.py, which lists "vllm" among its engines) and this module
run on the same running engine (``tests.engines.conftest.shared_engine``).

Run in the vLLM environment: ``.venv-vllm/bin/python -m pytest -m vllm tests/workers``.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (it lives in .venv-vllm)")

from tokenizers import Tokenizer  # noqa: E402

from core.errors import InvalidRequest  # noqa: E402
from core.messages import BlockStored, SamplingParams  # noqa: E402
from core.settings import VllmSettings  # noqa: E402
from router.hashing import block_hashes, root_hash  # noqa: E402
from tests.engines.conftest import EngineCase, shared_engine  # noqa: E402
from tests.workers.vllm_support import MODEL, smollm2_weights_dir  # noqa: E402
from workers.engines.base import EngineOutput, EngineRequest, EngineStartError, StepStats  # noqa: E402
from workers.engines.vllm.engine import VllmEngine, to_vllm_sampling  # noqa: E402

pytestmark = pytest.mark.vllm

FRANCE = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
)
EOS = 2


@pytest.fixture(scope="session")
async def engine() -> AsyncIterator[EngineCase]:
    async with shared_engine("vllm") as case:
        yield case


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(smollm2_weights_dir() / "tokenizer.json"))


async def run(case: EngineCase, prompt: list[int], sampling: SamplingParams) -> list[EngineOutput]:
    request = EngineRequest(f"vllm-{uuid.uuid4().hex[:12]}", prompt, sampling)

    async def collect() -> list[EngineOutput]:
        return [out async for out in case.engine.generate(request)]

    return await asyncio.wait_for(collect(), 60)


async def test_answers_the_france_question(engine: EngineCase, tokenizer: Tokenizer) -> None:
    prompt = tokenizer.encode(FRANCE).ids
    outputs = await run(engine, prompt, SamplingParams(max_tokens=32, temperature=0.0))
    tokens = [t for out in outputs for t in out.token_ids]
    assert tokenizer.decode(tokens, skip_special_tokens=True) == "The capital of France is Paris."
    assert tokens[-1] == EOS and outputs[-1].finish_reason == "stop"
    usage = outputs[-1].usage
    assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (len(prompt), len(tokens))


async def test_info_comes_from_the_engine(engine: EngineCase) -> None:
    info = engine.engine.info
    assert (info.model, info.engine) == (MODEL, "vllm")
    assert info.block_size % 32 == 0  # vLLM on CPU
    assert info.kv_blocks > 0 and info.max_num_seqs == 16
    assert (info.context_length, info.vocab_size) == (8192, 49152)
    assert engine.engine.load().total_blocks == info.kv_blocks


async def test_stored_events_name_the_prompt_blocks_in_sluice_hashes(engine: EngineCase) -> None:
    block = engine.engine.info.block_size
    prompt = engine.prompt(3 * block + 7)
    before = len(engine.kv_events.events)
    await run(engine, prompt, SamplingParams(max_tokens=2, temperature=0.0))
    expected = block_hashes(prompt, block, root_hash(MODEL))

    def announced() -> set[int]:
        new = engine.kv_events.events[before:]
        return {h for ev in new if isinstance(ev, BlockStored) for h in ev.block_hashes}

    for _ in range(100):
        if set(expected) <= announced():
            break
        await asyncio.sleep(0.05)
    assert set(expected) <= announced()
    assert set(expected) <= set(engine.engine.cached_block_hashes())


def test_vllms_logprobs_become_sluices() -> None:
    from vllm.logprobs import Logprob

    from workers.engines.vllm.engine import token_logprobs

    step = {7: Logprob(-0.5, rank=2), 9: Logprob(-0.1, rank=1), 3: Logprob(-2.0, rank=3)}
    (entry,) = token_logprobs([7], [step], 2)
    assert entry.logprob == -0.5 and entry.top == [(9, -0.1), (7, -0.5)]
    assert token_logprobs([7], [step], None) is None


async def test_every_engine_step_is_reported_with_its_time_and_tokens(engine: EngineCase, tokenizer: Tokenizer) -> None:
    steps: list[StepStats] = []
    engine.engine.on_step = steps.append
    try:
        prompt = tokenizer.encode(FRANCE + "Paris.<|im_end|>" * 3).ids
        outputs = await run(engine, prompt, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    finally:
        engine.engine.on_step = None
    assert sum(len(out.token_ids) for out in outputs) == 6
    usage = outputs[-1].usage
    assert usage is not None
    prefills = [s for s in steps if s.phase == "prefill"]
    assert sum(s.prefill_tokens for s in prefills) == len(prompt) - usage.cached_tokens
    assert sum(s.decode_tokens for s in steps) >= 5
    assert all(s.duration_s is not None and s.duration_s > 0 for s in steps)


def test_a_step_is_read_from_vllm_iteration_details() -> None:
    from vllm.v1.metrics.stats import IterationStats, SchedulerIterationDetails, SchedulerStats

    from workers.engines.vllm.stats import step_of

    details = SchedulerIterationDetails(iteration_index=3, num_ctx_requests=1, num_ctx_tokens=100,
                                        num_generation_requests=2, num_generation_tokens=2, elapsed_ms=12.5)
    iteration = IterationStats()
    iteration.num_preempted_reqs = 1
    assert step_of(SchedulerStats(iteration_details=details, kv_cache_usage=0.25), iteration) == StepStats(
        0.0125, prefill_tokens=100, decode_tokens=2, preemptions=1, kv_usage=0.25)
    assert step_of(SchedulerStats(), iteration) == StepStats(None, preemptions=1)
    assert step_of(SchedulerStats(), IterationStats()) is None
    dummy = SchedulerIterationDetails(iteration_index=4, num_ctx_requests=0, num_ctx_tokens=0,
                                      num_generation_requests=0, num_generation_tokens=0, elapsed_ms=0.0, is_dummy=True)
    assert step_of(SchedulerStats(iteration_details=dummy), None) is None


def test_sampling_maps_to_vllm() -> None:
    from vllm.sampling_params import RequestOutputKind

    params = to_vllm_sampling(
        SamplingParams(max_tokens=7, temperature=0.5, top_p=0.9, seed=3, stop_token_ids=(5, 6), min_tokens=2)
    )
    assert (params.max_tokens, params.temperature, params.top_p, params.seed) == (7, 0.5, 0.9, 3)
    assert (params.stop_token_ids, params.min_tokens, params.ignore_eos) == ([5, 6], 2, False)
    assert params.output_kind == RequestOutputKind.DELTA and params.detokenize is False
    params = to_vllm_sampling(SamplingParams(
        max_tokens=7, top_k=20, min_p=0.05, presence_penalty=0.5, frequency_penalty=-0.5, repetition_penalty=1.2,
        logit_bias=((42, 5.0), (7, -100.0))))
    assert (params.top_k, params.min_p, params.repetition_penalty) == (20, 0.05, 1.2)
    assert (params.presence_penalty, params.frequency_penalty) == (0.5, -0.5)
    assert params.logit_bias == {42: 5.0, 7: -100.0}
    assert to_vllm_sampling(SamplingParams(max_tokens=1)).top_k in (-1, 0)  # every token


class _WarmUpLlm:
    """What ``_warm_logprobs`` sees of vLLM's ``AsyncLLM``: ``generate``, which records its call."""

    def __init__(self, error: Exception | None = None) -> None:
        self.calls: list[tuple[dict, object, str]] = []
        self.error = error

    async def generate(self, prompt: dict, sampling: object, request_id: str) -> AsyncIterator[object]:
        self.calls.append((prompt, sampling, request_id))
        if self.error is not None:
            raise self.error
        yield object()


async def test_start_compiles_the_logprobs_kernel_with_a_request_that_caches_nothing(
        caplog: pytest.LogCaptureFixture) -> None:
    """The start-up request asks for one token with both kinds of logprobs (each compiles vLLM's
    ranking kernel on first use), on a prompt shorter than a block: nothing enters the prefix cache,
    no KV event reaches the router. A failure is logged: the worker starts all the same."""
    from workers.engines.vllm.engine import _warm_logprobs

    llm = _WarmUpLlm()
    await _warm_logprobs(llm)  # type: ignore[arg-type]
    ((prompt, sampling, _),) = llm.calls
    assert 2 <= len(prompt["prompt_token_ids"]) < 16  # prompt logprobs need two tokens; blocks hold 16 or more
    assert (sampling.max_tokens, sampling.logprobs, sampling.prompt_logprobs) == (1, 1, 1)
    failing = _WarmUpLlm(RuntimeError("engine core gone"))
    await _warm_logprobs(failing)  # type: ignore[arg-type]
    assert "could not be compiled at start: engine core gone" in caplog.text


async def test_a_tokenizer_only_directory_does_not_start(tmp_path: Path) -> None:
    source = smollm2_weights_dir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, tmp_path / name)
    with pytest.raises(EngineStartError, match="no weights"):
        await VllmEngine(MODEL, tmp_path, VllmSettings()).start()


async def test_a_broken_model_raises_engine_start_error(tmp_path: Path) -> None:
    source = smollm2_weights_dir()
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(source / name, tmp_path / name)
    config = json.loads((source / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(EngineStartError, match="vLLM could not load"):
        await VllmEngine(MODEL, tmp_path, VllmSettings()).start()


async def test_abort_right_after_submission_ends_with_abort(engine: EngineCase) -> None:
    request = EngineRequest(f"vllm-early-{uuid.uuid4().hex[:8]}", engine.prompt(50), SamplingParams(max_tokens=1000))

    async def collect() -> list[EngineOutput]:
        return [out async for out in engine.engine.generate(request)]

    task = asyncio.create_task(collect())
    await asyncio.sleep(0)  # the request is registered, vLLM may not have it yet
    await engine.engine.abort(request.request_id)
    outputs = await asyncio.wait_for(task, 30)
    assert outputs[-1].finish_reason == "abort"
    assert engine.engine.load().running == engine.engine.load().waiting == 0


async def test_a_prompt_longer_than_the_context_is_refused(engine: EngineCase) -> None:
    too_long = engine.prompt(engine.engine.info.context_length + 1)
    with pytest.raises(Exception, match="(?i)longer than|maximum|max_model_len|context"):
        await run(engine, too_long, SamplingParams(max_tokens=1))
    assert engine.engine.load().waiting == 0
    outputs = await run(engine, engine.prompt(8), SamplingParams(max_tokens=2, temperature=0.0))
    assert outputs[-1].finish_reason == "length"


async def test_an_adapter_not_loaded_is_refused_as_a_bad_request(engine: EngineCase) -> None:
    """A client's mistake (400), not an engine failure (502): the host passes the error's type on."""
    request = EngineRequest(f"vllm-lora-{uuid.uuid4().hex[:8]}", engine.prompt(8), SamplingParams(max_tokens=2),
                            lora="an-adapter")
    with pytest.raises(InvalidRequest, match="LoRA") as refused:
        await asyncio.wait_for(anext(engine.engine.generate(request)), 10)
    assert (refused.value.status_code, refused.value.code) == (400, "lora_not_loaded")
    # This engine was started without LoRA: loading one is refused too, saying so.
    with pytest.raises(InvalidRequest, match="without LoRA support") as no_lora:
        await engine.engine.load_lora("an-adapter", "/nonexistent")
    assert no_lora.value.code == "lora_not_supported"
    assert engine.engine.load().running == engine.engine.load().waiting == 0
