"""Celery tasks of the inference workers. Tasks take plain data and hand it to the engine host."""

from __future__ import annotations

from core.wire import GENERATE_TASK, PREFILL_TASK
from workers.celery_app import app
from workers.runtime import RUNTIME


@app.task(name=GENERATE_TASK, ignore_result=True, acks_late=False)
def generate(payload: dict) -> None:
    """Serve one request: stream its tokens to ``payload['reply_channel']`` until it ends."""
    RUNTIME.require_host().serve(payload)


@app.task(name=PREFILL_TASK, ignore_result=True, acks_late=False)
def prefill(payload: dict) -> None:
    """Compute one request's prompt and first token for the decode worker ``payload['decode']``,
    then push its ``generate`` task there (workers.host)."""
    RUNTIME.require_host().serve(payload)
