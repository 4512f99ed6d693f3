"""Request migration on the real model: two aggregated vLLM workers; the one serving a greedy stream
is SIGKILLed mid-stream, and the stream continues on the other, its text equal to the same request's
uninterrupted text. The signal reaches the worker process alone, as the OOM killer's does: the vLLM
engine core it started ends by itself (workers/engines/die_with_worker.py).

Run in the vLLM environment: ``.venv-vllm/bin/python -m pytest -m vllm tests/e2e/test_vllm_migration.py``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import openai
import pytest

from sluice.devstack import Stack
from tests.workers.vllm_support import MODEL, VLLM_SKIP, smollm2_weights_dir

pytestmark = [pytest.mark.vllm, VLLM_SKIP]

START_TIMEOUT_S = 400


@pytest.fixture(scope="module")
def pair(redis_server) -> Iterator[Stack]:  # noqa: ANN001
    s = Stack(redis_url=redis_server.url, namespace=f"vmig{uuid.uuid4().hex[:8]}", model_path=smollm2_weights_dir(),
              env_extra={"SLUICE_ENGINE": "vllm", "SLUICE_WORKER__VLLM__MAX_NUM_SEQS": "4",
                         "SLUICE_WORKER__VLLM__KV_CACHE_GIB": "0.5", "SLUICE_WORKER__VLLM__OMP_THREADS": "1",
                         # Two vLLM processes share two cores: a heartbeat may come seconds late.
                         "SLUICE_WORKER__LEASE_TTL_S": "10"})
    try:
        s.start_worker("a1")
        s.start_worker("a2")
        s.start_frontend()
        s.wait_ready(MODEL, workers=2, timeout=START_TIMEOUT_S)
        yield s
    finally:
        s.stop()


def _stream(client: openai.OpenAI, worker: str) -> openai.Stream:
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Write a long story about a lighthouse keeper."}],
        max_tokens=80, temperature=0, stream=True, extra_body={"ignore_eos": True},
        stream_options={"include_usage": True}, extra_headers={"x-sluice-router": f"worker_id={worker}"})


def test_a_killed_vllm_worker_s_stream_continues_on_the_other_with_the_same_text(pair: Stack) -> None:
    client = openai.OpenAI(base_url=f"{pair.base_url}/v1", api_key="x", max_retries=0, timeout=300)
    reference = list(_stream(client, "a2"))
    it = iter(_stream(client, "a1"))
    head = [next(it) for _ in range(10)]
    pair.kill("a1", alone=True)  # the worker process only: its engine core must end by itself
    moved = [*head, *it]

    def text(chunks: list) -> str:
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    assert text(moved) == text(reference)
    usage = [c.usage for c in moved if c.usage is not None]
    assert len(usage) == 1 and usage[0].completion_tokens == 80
    assert usage[0].prompt_tokens == next(c.usage for c in reference if c.usage is not None).prompt_tokens
