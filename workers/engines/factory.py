"""Builds the engine a worker is configured for. Engines are imported lazily: the vLLM stack is
heavy and only a vLLM worker needs it."""

from __future__ import annotations

import json
import logging
import os
import signal
from pathlib import Path

from core.settings import Settings
from workers.engines.base import Engine

log = logging.getLogger(__name__)


def _context_length(model_path: Path, default: int = 8192) -> int:
    config = model_path / "config.json"
    if config.is_file():
        data = json.loads(config.read_text())
        return int(data.get("max_position_embeddings") or data.get("max_seq_len") or default)
    return default


def shut_worker_down(reason: str) -> None:
    """An engine died: ask this worker process for Celery's warm shutdown (SIGTERM).

    The worker then stops taking tasks, lets the running ones end (their streams have already
    failed with an error), and its ``worker_shutdown`` handler deregisters it, so routers drop it
    at once instead of after a lease. A process supervisor may restart it.
    """
    log.critical("engine died (%s): shutting this worker down", reason)
    os.kill(os.getpid(), signal.SIGTERM)


def create_engine(settings: Settings) -> Engine:
    model_path = settings.resolved_model_path()
    if settings.worker.engine == "mocker":
        from workers.engines.mocker import MockerEngine
        from workers.engines.mocker_script import MockerScript

        mocker = settings.worker.mocker
        script = MockerScript.load(mocker.script, model_path) if mocker.script else None
        return MockerEngine(settings.model, mocker, context_length=_context_length(model_path),
                            kv_hold_s=settings.disagg.kv_hold_s, script=script)
    if settings.worker.engine == "vllm":
        from workers.engines.vllm_engine import VllmEngine
        from workers.engines.vllm_kv_transfer import KvTransferSetup, free_port

        vllm = settings.worker.vllm
        transfer = None
        if settings.worker.pool in ("prefill", "decode"):  # vLLM's NixlConnector moves the KV
            transfer = KvTransferSetup(vllm.nixl_host, vllm.nixl_port or free_port(vllm.nixl_host),
                                       settings.disagg.kv_hold_s)
        return VllmEngine(settings.model, model_path, vllm, on_dead=shut_worker_down, transfer=transfer)
    raise ValueError(f"unknown engine {settings.worker.engine!r}")
