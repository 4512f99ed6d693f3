"""Worker start-up and shut-down, wired to Celery's signals.

* ``celeryd_after_setup``: turn off kombu's ack emulation (see below), pick the worker id (Celery's node name unless SLUICE_WORKER__WORKER_ID
  is set), consume the pool queue and the worker's own queue, build the engine (its spec refuses a
  pool it cannot serve before anything loads: workers.engines.factory), start the engine host (loading
  the model), then serve the worker's ``/metrics`` (workers.metrics). A worker whose engine or metrics
  endpoint cannot start exits with a clear message and never registers.
* ``worker_ready``: the consumer is up, so register under a lease (routers may now pick us).
* ``worker_shutting_down`` (SIGTERM: Celery's warm shutdown begins): drain. The load record says
  ``draining`` at once, so routers stop picking the worker; what runs finishes; a task that starts
  now is refused with ``worker_draining`` and its frontend moves it to another worker.
* ``worker_shutdown``: abort what runs, deregister, stop the engine, then freeze the heap: the
  interpreter's exit would otherwise run its last garbage collections over everything the engine
  loaded (torch and vLLM's modules: 5 to 13 s of CPU on a loaded 2-core machine, measured), which
  kept an idle vLLM worker alive well past the 5 s honcho gives it before SIGKILL. Nothing of that
  heap is needed once the engine has stopped; the process exits right after.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
from typing import NoReturn

from celery.signals import celeryd_after_setup, worker_ready, worker_shutdown, worker_shutting_down

from core.keys import Keys
from core.settings import get_settings
from router.registry import WorkerIdentity
from workers.engines.base import EngineStartError
from workers.engines.factory import create_engine
from workers.engines.spec import EngineConfigError
from workers.host import EngineHost
from workers.runtime import RUNTIME

log = logging.getLogger(__name__)


@celeryd_after_setup.connect
def _start_engine(sender: str, instance, **_: object) -> None:
    settings = get_settings()
    keys = Keys(settings.redis.namespace)
    if keys.bookkeeping_queue in instance.app.amqp.queues.consume_from:
        return  # the bookkeeper (workers/bookkeeping.py) hosts no engine
    # No ack emulation for inference tasks: kombu would record every delivered message in an unacked
    # hash (a MULTI/EXEC round trip before the task starts and another at the ack) only to redeliver
    # it after the visibility timeout, long after its client gave up. A request lost with a killed
    # worker ends at the frontend instead (the worker's lease expires and its streams fail). The
    # bookkeeper keeps the emulation: a usage record must survive its crash.
    instance.app.conf.broker_transport_options = {**instance.app.conf.broker_transport_options,
                                                  "ack_emulation": False}
    worker_id = settings.worker.worker_id or sender
    model_path = settings.resolved_model_path()
    identity = WorkerIdentity(
        worker_id=worker_id, model=settings.model, model_path=str(model_path), pool=settings.worker.pool,
        queue=keys.worker_queue(worker_id), pool_queue=keys.pool_queue(settings.model, settings.worker.pool),
    )
    instance.app.amqp.queues.select_add(identity.pool_queue)
    instance.app.amqp.queues.select_add(identity.queue)
    if not (model_path / "tokenizer.json").is_file():
        _die(f"model {settings.model!r}: no tokenizer at {model_path} (run `sluice models prepare {settings.model}` "
             "or set SLUICE_MODEL_PATH)")
    try:
        engine = create_engine(settings)  # checks the engine's spec before it builds anything
    except EngineConfigError as exc:
        _die(str(exc))
    host = EngineHost(settings, engine, identity)
    try:
        host.start()
    except EngineStartError as exc:
        _die(f"engine {settings.worker.engine!r} failed to start: {exc}")
    except Exception as exc:  # noqa: BLE001 - anything else at start-up is just as fatal
        log.exception("engine start failed")
        _die(f"engine {settings.worker.engine!r} failed to start: {type(exc).__name__}: {exc}")
    # After the engine: vLLM forks its engine core from this process, which must not copy the
    # endpoint's listening socket and thread into it.
    try:
        host.serve_metrics()
    except OSError as exc:
        host.stop()
        _die(f"cannot serve /metrics on {settings.worker.metrics_host}:{settings.worker.metrics_port} "
             f"(SLUICE_WORKER__METRICS_HOST / SLUICE_WORKER__METRICS_PORT; port 0 picks a free one, -1 serves "
             f"none): {exc}")
    RUNTIME.host = host


@worker_ready.connect
def _go_live(**_: object) -> None:
    if RUNTIME.host is not None:
        RUNTIME.host.go_live()


@worker_shutting_down.connect
def _drain(**_: object) -> None:
    if RUNTIME.host is not None:
        RUNTIME.host.drain()


@worker_shutdown.connect
def _stop(**_: object) -> None:
    if RUNTIME.host is not None:
        RUNTIME.host.stop()
        gc.freeze()


def _die(message: str) -> NoReturn:
    """Celery swallows exceptions raised by signal receivers: exit the process ourselves."""
    print(f"sluice worker: {message}", file=sys.stderr, flush=True)
    logging.shutdown()
    os._exit(3)
