"""The bookkeeper: writes the usage records that frontends ship as batches (app/accounts/shipper.py).

Run it as its own Celery worker on the bookkeeping queue, with no engine: :func:`main` (what a
``sluice bookkeeper`` command calls) runs the equivalent of::

    celery -A workers.celery_app worker -I workers.bookkeeping -Q sluice.{namespace}.bookkeeping \
        --pool threads -c 2 -n bookkeeper@%h

A batch is never lost to a database outage:

* ``autoretry_for`` the "database unusable" errors (core.db.DB_UNAVAILABLE), forever
  (``max_retries=None``), with exponential backoff and jitter capped at
  ``accounts.usage_retry_backoff_max_s``. A retry publishes a copy of the message (same queue,
  counting down) BEFORE the original is acknowledged.
* ``acks_late``: a message is acknowledged only after its rows are committed (or its retry copy is
  published). Until then kombu's Redis transport keeps it in the namespace's ``unacked`` hash (under
  its broker prefix, core.keys): a worker that shuts down (SIGTERM, warm shutdown) puts it back on the
  queue at once, retry copies waiting for their countdown included; one that dies (SIGKILL, OOM, host
  lost) has it put back by any other bookkeeper of the namespace once the broker's
  ``visibility_timeout`` (workers/celery_app.py) has passed.
  ``reject_on_worker_lost`` requeues, rather than acknowledges, a task whose pool child died (it
  matters if this task ever runs in a prefork pool; in the threads pool the process is the worker).
* Writes are idempotent (``request_id`` is unique), so a batch delivered twice counts once.

Anything else (a malformed batch, a record version this code does not know) fails the task and
Celery logs it: retrying could not help.
"""

from __future__ import annotations

import logging
from typing import Any

from core.accounting import usage_batch_from_builtins
from core.db import DB_UNAVAILABLE, database_url, open_database
from core.db.usage import insert_usage
from core.keys import Keys
from core.settings import get_settings
from core.wire import RECORD_USAGE_TASK
from workers.celery_app import app, celery_global_options

log = logging.getLogger(__name__)


@app.task(name=RECORD_USAGE_TASK, acks_late=True, reject_on_worker_lost=True, autoretry_for=DB_UNAVAILABLE,
          max_retries=None, retry_backoff=1, retry_backoff_max=get_settings().accounts.usage_retry_backoff_max_s,
          retry_jitter=True, ignore_result=True)
def record_usage(records: list[dict[str, Any]]) -> int:
    """Insert one batch of usage records (core.accounting.usage_batch_to_builtins); returns how many
    rows were new."""
    batch = usage_batch_from_builtins(records)
    inserted = insert_usage(open_database(database_url(get_settings())), batch)
    log.info("recorded %d usage rows (%d already stored)", inserted, len(batch) - inserted)
    return inserted


def main(argv: list[str] | None = None) -> None:
    """Run a bookkeeper worker on this namespace's bookkeeping queue (extra arguments go to Celery)."""
    settings = get_settings()
    queue = Keys(settings.redis.namespace).bookkeeping_queue
    app.worker_main([*celery_global_options(settings), "worker", "-I", "workers.bookkeeping", "-Q", queue, "--pool", "threads", "-c", "2",
                     "-n", "bookkeeper@%h", "--loglevel", "INFO", *(argv or [])])

