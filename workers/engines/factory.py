"""Builds the engine a worker is configured for, by the engine's name (:data:`BUILDERS`). Engines are
imported lazily: the vLLM stack is heavy and only a vLLM worker needs it."""

from __future__ import annotations

import json
import logging
import os
import signal
from collections.abc import Callable
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


def _mocker(settings: Settings, model_path: Path) -> Engine:
    from workers.engines.mocker.engine import MockerEngine
    from workers.engines.mocker.script import MockerScript

    mocker = settings.worker.mocker
    script = MockerScript.load(mocker.script, model_path) if mocker.script else None
    return MockerEngine(settings.model, mocker, context_length=_context_length(model_path),
                        kv_hold_s=settings.disagg.kv_hold_s, script=script)


def _vllm(settings: Settings, model_path: Path) -> Engine:
    from workers.engines.vllm.engine import VllmEngine
    from workers.engines.vllm.kv_transfer import KvTransferSetup, free_port

    vllm = settings.worker.vllm
    transfer = None
    if settings.worker.pool.transfers_kv:  # vLLM's NixlConnector moves the KV
        transfer = KvTransferSetup(vllm.nixl_host, vllm.nixl_port or free_port(vllm.nixl_host),
                                   settings.disagg.kv_hold_s)
    return VllmEngine(settings.model, model_path, vllm, on_dead=shut_worker_down, transfer=transfer)


#: Each engine's builder by its name (``core.settings.EngineKind``); a builder imports its engine when
#: called. Adding an engine: its settings group in core.settings (named as the engine), a builder here.
BUILDERS: dict[str, Callable[[Settings, Path], Engine]] = {"mocker": _mocker, "vllm": _vllm}


def create_engine(settings: Settings) -> Engine:
    try:
        build = BUILDERS[settings.worker.engine]
    except KeyError:
        raise ValueError(f"unknown engine {settings.worker.engine!r}") from None
    return build(settings, settings.resolved_model_path())
