"""The Celery application: broker, serialization and worker-side wiring.

Light to import (no engine imports): the frontend and tools may import it to name tasks. Task
results are never stored; tokens travel on pub/sub. A worker runs the ``threads`` pool: its one
engine is shared by all its tasks, and an engine that starts child processes (vLLM) cannot live
in a prefork child (those are daemonic and may not have children).

Start a worker with ``sluice worker`` (or ``celery -A workers.celery_app worker --pool threads``);
it consumes its pool's shared queue and its own queue (added at start-up, see workers.signals).
"""

from __future__ import annotations

from celery import Celery

from core.keys import Keys
from core.settings import get_settings


def create_celery_app() -> Celery:
    settings = get_settings()
    keys = Keys(settings.redis.namespace)
    app = Celery("sluice", broker=settings.redis.url, include=["workers.tasks", "workers.signals", "workers.bookkeeping"])
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        result_backend=None,
        task_acks_late=False,
        worker_prefetch_multiplier=1,
        task_default_queue=keys.pool_queue(settings.model, settings.worker.pool),
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_send_task_events=settings.worker.task_events,
        task_send_sent_event=False,
        broker_transport_options={"visibility_timeout": 3600},
        worker_disable_rate_limits=True,
        # Task events flushed in batches (every few ms) instead of after every consumer loop turn.
        worker_consumer="workers.consumer:Consumer",
    )
    return app


app = create_celery_app()
