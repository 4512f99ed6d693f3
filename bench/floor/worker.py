"""The floor worker (see :mod:`bench.floor`): ``celery -A bench.floor.worker worker --pool threads``.

A stock Celery app on ``FLOOR_REDIS_URL``: its one task answers a request with one ``PUBLISH``.
"""

from __future__ import annotations

import os

import orjson
import redis
from celery import Celery

from bench.floor.frontend import TASK

URL = os.environ.get("FLOOR_REDIS_URL", "redis://127.0.0.1:6379/0")
app = Celery("floor", broker=URL)
app.conf.update(task_serializer="json", accept_content=["json"], task_ignore_result=True, result_backend=None,
                worker_prefetch_multiplier=1, task_default_queue=os.environ.get("FLOOR_QUEUE", "floor"),
                worker_hijack_root_logger=False, worker_disable_rate_limits=True, worker_send_task_events=False)
_redis = redis.Redis.from_url(URL)


@app.task(name=TASK, ignore_result=True)
def generate(channel: str, rid: str, tokens: int) -> None:
    _redis.publish(channel, orjson.dumps([rid, tokens]))
