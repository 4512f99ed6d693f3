"""Builds the vLLM engine a worker is configured for (the builder its spec names:
workers.engines.vllm.spec). Importing it imports vLLM."""

from __future__ import annotations

from pathlib import Path

from vllm.platforms import current_platform

from core.settings import Settings
from workers.engines.factory import shut_worker_down
from workers.engines.vllm.engine import VllmEngine
from workers.engines.vllm.kv_transfer import KvTransferSetup, free_port
from workers.engines.vllm.spec import SPEC


def build(settings: Settings, model_path: Path) -> VllmEngine:
    vllm = settings.worker.vllm
    SPEC.limits.check(SPEC.name, block_size=vllm.block_size, on_cpu=current_platform.is_cpu())
    transfer = None
    if settings.worker.pool.transfers_kv:  # vLLM's NixlConnector moves the KV
        transfer = KvTransferSetup(vllm.nixl_host, vllm.nixl_port or free_port(vllm.nixl_host),
                                   settings.disagg.kv_hold_s)
    return VllmEngine(settings.model, model_path, vllm, on_dead=shut_worker_down, transfer=transfer,
                      kvbm=settings.kvbm if settings.kvbm.enabled else None)
