"""The Celery application: broker, serialization and worker-side wiring.

Light to import (no engine imports): the frontend and tools may import it to name tasks. Task
results are never stored; tokens travel on pub/sub. A worker runs the ``threads`` pool: its one
engine is shared by all its tasks, and an engine that starts child processes (vLLM) cannot live
in a prefork child (those are daemonic and may not have children).

Start a worker with ``sluice worker`` (or ``celery -A workers.celery_app worker --pool threads``);
it consumes its pool's shared queue and its own queue (added at start-up, see workers.signals).

Namespaces: every key and pub/sub channel of the broker lives under the namespace's
``Keys.broker_prefix`` (kombu's ``global_keyprefix``, which kombu applies to the fanout channels of task
events and broadcast commands too), so the workers, Flower and ``celery inspect`` of one namespace
never see another's. Everything started from this app (``sluice worker``, ``sluice bookkeeper``,
``sluice flower``) gets it; a bare ``celery`` command must be given ``-A workers.celery_app`` too.
"""

from __future__ import annotations

from celery import Celery
from celery.signals import setup_logging

from core.keys import Keys
from core.logs import configure_logging
from core.settings import Settings, get_settings


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
        broker_transport_options={"visibility_timeout": 3600, "global_keyprefix": keys.broker_prefix,
                                  # read by kombu's sentinel:// transport only (a Sentinel-managed broker)
                                  "master_name": settings.redis.sentinel_master},
        worker_disable_rate_limits=True,
        # Task events flushed in batches (every few ms) instead of after every consumer loop turn.
        worker_consumer="workers.consumer:Consumer",
    )
    return app


app = create_celery_app()


def celery_global_options(settings: Settings) -> list[str]:
    """Options of the ``celery`` command for a worker process: with JSON logs, no start-up banner
    (it is not a log record). Logging is set up here already, for what Celery warns of before its
    own set-up (running as root, say)."""
    configure_logging(settings.log_format, "INFO")
    return ["--quiet"] if settings.log_format == "json" else []


@setup_logging.connect
def _configure_logging(loglevel: int | str | None = None, **_: object) -> None:
    """Celery leaves logging to us once this is connected: the process logs as every Sluice
    process does (core.logs, ``SLUICE_LOG_FORMAT``)."""
    configure_logging(get_settings().log_format, loglevel or "INFO")
