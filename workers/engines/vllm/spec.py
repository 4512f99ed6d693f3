"""vLLM's declaration (workers.engines.spec): every pool (the prefill and decode pools through vLLM's
NixlConnector, workers.engines.vllm.kv_transfer), KV events (always on), LoRA (with
``SLUICE_WORKER__VLLM__MAX_LORAS`` > 0), the model's weights, and a KV block size that is a multiple of
32 on a CPU (vLLM's CPU attention refuses 16). Imports nothing of vLLM: the CLI and mocker workers
list it."""

from __future__ import annotations

from core.pools import Pool
from core.settings import VllmSettings
from workers.engines.spec import BuilderRef, Capabilities, EngineSpec, Limits

SPEC = EngineSpec(
    name="vllm",
    settings=VllmSettings,
    capabilities=Capabilities(pools=frozenset(Pool), kv_events=True, lora=True),
    needs_weights=True,
    builder=BuilderRef("workers.engines.vllm.build", "build"),
    limits=Limits(cpu_block_size_multiple=32),
)
