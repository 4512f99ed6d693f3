"""The mocker's declaration (workers.engines.spec): every pool, KV events, LoRA, and no weights (it
serves a model from its tokenizer alone). Imports nothing of the engine itself."""

from __future__ import annotations

from core.pools import Pool
from core.settings import MockerSettings
from workers.engines.spec import BuilderRef, Capabilities, EngineSpec

SPEC = EngineSpec(
    name="mocker",
    settings=MockerSettings,
    # Disaggregation is simulated: the prefill worker holds the blocks, the decode worker waits out
    # the transfer time of its settings (kv_bytes_per_block, transfer_gb_per_s).
    capabilities=Capabilities(pools=frozenset(Pool), kv_events=True, lora=True),
    needs_weights=False,
    builder=BuilderRef("workers.engines.mocker.build", "build"),
)
