"""Builds the mocker a worker is configured for (the builder its spec names: workers.engines.mocker.spec)."""

from __future__ import annotations

import json
from pathlib import Path

from core.settings import Settings
from workers.engines.mocker.engine import MockerEngine
from workers.engines.mocker.script import MockerScript
from workers.engines.mocker.tiers import MockerTiers
from workers.kvbm.tiers import KvTiers


def context_length(model_path: Path, default: int = 8192) -> int:
    """The model's context length, from its config.json (the mocker may have a tokenizer alone: ``default``)."""
    config = model_path / "config.json"
    if config.is_file():
        data = json.loads(config.read_text())
        return int(data.get("max_position_embeddings") or data.get("max_seq_len") or default)
    return default


def build(settings: Settings, model_path: Path) -> MockerEngine:
    mocker = settings.worker.mocker
    script = MockerScript.load(mocker.script, model_path) if mocker.script else None
    store = KvTiers.open(settings.kvbm, scope=f"{settings.model}-mocker-{mocker.block_size}",
                         block_bytes=mocker.kv_bytes_per_block)
    tiers = MockerTiers(store, mocker, settings.kvbm) if store is not None else None
    return MockerEngine(settings.model, mocker, context_length=context_length(model_path),
                        kv_hold_s=settings.disagg.kv_hold_s, script=script, tiers=tiers)
