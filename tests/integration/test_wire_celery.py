"""core/wire.py against Celery itself: the message the frontend pushes by hand must be the one
Celery's ``app.amqp.as_task_v2`` builds and kombu's Redis transport writes for the same call,
field by field. Only values that differ between any two sends (the delivery tag, the sender's
origin) are left out; if a Celery or kombu release adds, drops or changes a field, this fails. Celery
sends with the namespace's broker prefix, as workers/celery_app.py configures it: its message lands in
the list the frontend pushes onto (``Keys.broker_queue_list``)."""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

import pytest
import redis
from celery import Celery

from core.keys import Keys
from core.wire import RECORD_USAGE_TASK, task_message

# Differ between senders, whoever builds them: the delivery tag (per message), the origin (per process)
# and reply_to (per Celery app instance: where an RPC result would go; results are never sent here).
_PER_SEND = {("properties", "delivery_tag"), ("headers", "origin"), ("properties", "reply_to")}


def _celery_app(url: str, keys: Keys | None = None) -> Celery:
    app = Celery("wire-check", broker=url, set_as_current=False)
    app.conf.update(task_serializer="json", accept_content=["json"], task_ignore_result=True, result_backend=None)
    if keys is not None:
        app.conf.broker_transport_options = {"global_keyprefix": keys.broker_prefix}
    return app


def _flatten(envelope: dict[str, Any]) -> dict[tuple[str, str], Any]:
    """``{(section, field): value}`` with the body decoded."""
    flat: dict[tuple[str, str], Any] = {}
    for section in ("headers", "properties"):
        for name, value in envelope[section].items():
            flat[(section, name)] = value
    for name in ("content-encoding", "content-type"):
        flat[("envelope", name)] = envelope[name]
    flat[("envelope", "body")] = json.loads(base64.b64decode(envelope["body"]))
    return {k: v for k, v in flat.items() if k not in _PER_SEND}


@pytest.fixture
def queue_and_client(redis_server, namespace):  # noqa: ANN001, ANN201
    client = redis.Redis.from_url(redis_server.url)
    keys = Keys(namespace)
    queue = keys.bookkeeping_queue
    yield keys, queue, client
    client.delete(keys.broker_queue_list(queue))
    client.close()


def test_the_pushed_message_is_the_one_celery_and_kombu_write(redis_server, queue_and_client) -> None:  # noqa: ANN001
    keys, queue, client = queue_and_client
    args = [{"rows": [[1, "k\"ey", 3.5]], "note": "unicode ✓ and \\ survive"}]
    task_id = str(uuid.uuid4())
    app = _celery_app(redis_server.url, keys)
    try:
        app.send_task(RECORD_USAGE_TASK, args=args, queue=queue, task_id=task_id, ignore_result=True)
    finally:
        app.close()
    by_celery = json.loads(client.rpop(keys.broker_queue_list(queue)))
    # argsrepr is display text (Flower shows it): Celery abbreviates nested values, the frontend
    # writes its own summary; the field itself must be where Celery puts it.
    argsrepr = by_celery["headers"]["argsrepr"]
    ours = json.loads(task_message(RECORD_USAGE_TASK, args, queue, task_id=task_id, argsrepr=argsrepr))
    theirs, mine = _flatten(by_celery), _flatten(ours)
    assert sorted(mine) == sorted(theirs), "fields differ: " + repr(set(mine) ^ set(theirs))
    for key in theirs:
        assert mine[key] == theirs[key], f"{key}: ours {mine[key]!r}, Celery's {theirs[key]!r}"


def test_headers_and_body_match_as_task_v2() -> None:
    app = _celery_app("memory://")
    args = [{"request_id": "r1", "token_ids": [1, 2, 3]}]
    built = app.amqp.as_task_v2("r1", "sluice.generate", args=args, kwargs={}, argsrepr="request r1",
                                ignore_result=True)
    ours = json.loads(task_message("sluice.generate", args, "q", task_id="r1", argsrepr="request r1"))
    headers = {k: v for k, v in built.headers.items() if k != "origin"}
    mine = {k: v for k, v in ours["headers"].items() if k != "origin"}
    # as_task_v2 leaves timelimit a tuple and kwargsrepr a repr; JSON makes them a list and a string.
    headers["timelimit"] = list(headers["timelimit"])
    assert mine == json.loads(json.dumps(headers))
    assert json.loads(base64.b64decode(ours["body"])) == json.loads(json.dumps(built.body))
    assert ours["properties"]["correlation_id"] == built.properties["correlation_id"]
    app.close()
