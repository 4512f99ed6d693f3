"""Builds the engine a worker is configured for, from its spec (workers.engines.registry), after checking
the configuration against what the spec declares: a worker that cannot serve fails before it loads a
model. The engine itself is imported only then: the vLLM stack is heavy and only a vLLM worker needs it."""

from __future__ import annotations

import logging
import os
import signal

from core.settings import Settings
from workers.engines.base import Engine
from workers.engines.registry import ENGINES, EngineRegistry

log = logging.getLogger(__name__)


def shut_worker_down(reason: str) -> None:
    """An engine died: ask this worker process for Celery's warm shutdown (SIGTERM).

    The worker then stops taking tasks, lets the running ones end (their streams have already
    failed with an error), and its ``worker_shutdown`` handler deregisters it, so routers drop it
    at once instead of after a lease. A process supervisor may restart it.
    """
    log.critical("engine died (%s): shutting this worker down", reason)
    os.kill(os.getpid(), signal.SIGTERM)


def create_engine(settings: Settings, engines: EngineRegistry = ENGINES) -> Engine:
    """The configured engine, built (not started). ``EngineConfigError`` (workers.engines.spec), before
    anything is built or imported, for an unknown engine or a pool it cannot serve; its builder may
    raise it too, for a limit of its settings it can only check once imported."""
    spec = engines.get(settings.worker.engine)
    spec.check_pool(settings.worker.pool)
    return spec.build(settings, settings.resolved_model_path())
