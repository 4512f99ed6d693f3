"""The task protocol between the frontend and the workers: task names and Celery messages.

The frontend enqueues one task per request on its hot path. ``apply_async`` costs about 1 ms of
CPU per call; building the same message here and pushing it with one ``LPUSH`` costs a fraction
of that, and Celery workers, Flower and ``celery inspect`` see an ordinary task message. This
module imports neither Celery nor kombu: the frontend (app, router) and the workers share it, and
the frontend never imports Celery. tests/integration/test_wire_celery.py holds the message equal,
field by field, to the one Celery and kombu build for the same call.

Format (Celery protocol v2 on kombu's Redis transport): a JSON envelope ``{body,
content-encoding, content-type, headers, properties}``; ``body`` is base64 of the JSON triple
``[args, kwargs, embed]``; the list key is the queue name (priority 0); workers ``BRPOP`` from the
right, so the frontend ``LPUSH``es.
"""

from __future__ import annotations

import base64
import os
import socket
import uuid
from dataclasses import dataclass
from typing import Any

import orjson

#: Generate tokens for one request (workers.tasks).
GENERATE_TASK = "sluice.generate"
#: Compute a prompt and its first token, then hand the request to a decode worker (workers.tasks).
PREFILL_TASK = "sluice.prefill"
#: Record one batch of usage rows (workers.bookkeeping).
RECORD_USAGE_TASK = "sluice.record_usage"

_ORIGIN = f"{os.getpid()}@{socket.gethostname()}"
_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


@dataclass(frozen=True, slots=True)
class TaskParts:
    """A task message for a queue not chosen yet: ``head + queue + tail`` is the message for
    ``queue`` (a queue name needs no JSON escaping). The KV router pushes it onto the queue it
    picks, in the same Redis call that picks it."""

    head: bytes
    tail: bytes

    def for_queue(self, queue: str) -> bytes:
        return self.head + queue.encode() + self.tail


def task_message(
    task_name: str,
    args: list[Any],
    queue: str,
    *,
    task_id: str | None = None,
    argsrepr: str | None = None,
) -> bytes:
    """The bytes to ``LPUSH`` onto ``queue`` so that a Celery worker runs ``task_name(*args)``."""
    task_id = task_id or str(uuid.uuid4())
    body = base64.b64encode(orjson.dumps([args, {}, _EMBED])).decode()
    envelope = {
        "body": body,
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {
            "lang": "py",
            "task": task_name,
            "id": task_id,
            "shadow": None,
            "eta": None,
            "expires": None,
            "group": None,
            "group_index": None,
            "retries": 0,
            "timelimit": [None, None],
            "root_id": task_id,
            "parent_id": None,
            "argsrepr": argsrepr if argsrepr is not None else repr(args)[:256],
            "kwargsrepr": "{}",
            "origin": _ORIGIN,
            "ignore_result": True,
            "replaced_task_nesting": 0,
            "stamped_headers": None,
            "stamps": {},
        },
        "properties": {
            "correlation_id": task_id,
            "reply_to": "",
            "delivery_mode": 2,
            "delivery_info": {"exchange": "", "routing_key": queue},
            "priority": 0,
            "body_encoding": "base64",
            "delivery_tag": str(uuid.uuid4()),
        },
    }
    return orjson.dumps(envelope)


#: Stands for the queue name in :func:`task_message_parts` (never part of a real message).
_QUEUE_MARK = "\x1fsluice-queue\x1f"
_QUEUE_MARK_JSON = orjson.dumps(_QUEUE_MARK)[1:-1]


def task_message_parts(task_name: str, args: list[Any], *, task_id: str | None = None,
                       argsrepr: str | None = None) -> TaskParts:
    """:func:`task_message` for a queue not chosen yet (see :class:`TaskParts`)."""
    head, tail = task_message(task_name, args, _QUEUE_MARK, task_id=task_id, argsrepr=argsrepr).split(
        _QUEUE_MARK_JSON)
    return TaskParts(head, tail)
