"""Starting a vLLM engine on the default model for tests (needs the vLLM environment).

Used by tests/workers/test_vllm_engine.py and, as one entry, by the engine conformance suite
(tests/engines/conftest.py)::

    ENGINES["vllm"] = EngineSpec(start_vllm_engine, marks=(pytest.mark.vllm, VLLM_SKIP))
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from core.settings import VllmSettings, get_settings
from workers.engines.base import Engine, KvEventSink

MODEL = "smollm2"

#: Small enough for a shared 2-core test machine; big enough for the conformance tests. The KV cache
#: holds one request of the model's whole context (8,192 tokens; 0.4 GiB is about 9,300 float32
#: tokens of SmolLM2) and little more: the eviction test fills it about three times over, prefill
#: time that grows with its size. OpenMP threads set explicitly: left to vLLM, a 2-core machine gets
#: one thread.
TEST_SETTINGS = VllmSettings(max_num_seqs=16, kv_cache_gib=0.4, omp_threads=os.cpu_count() or 1)

VLLM_SKIP = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vLLM is not installed (it lives in .venv-vllm: .venv-vllm/bin/python -m pytest -m vllm)",
)


def smollm2_weights_dir() -> Path:
    """The default model with weights, prepared once into the user's Sluice cache."""
    from workers.models import prepare_model

    return prepare_model(MODEL, get_settings().models_dir, weights=True, progress=False)


async def start_vllm_engine(sink: KvEventSink) -> tuple[Engine, None]:
    """Start vLLM on SmolLM2 (about a minute on CPU). Its output is not known in advance: None."""
    from workers.engines.vllm.engine import VllmEngine

    engine = VllmEngine(MODEL, smollm2_weights_dir(), TEST_SETTINGS)
    await engine.start(sink)
    return engine, None
