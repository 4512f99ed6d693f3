"""kombu's Redis transport: how it stores a queue, which the reaper (router.reaper) deletes for a gone
worker by key, without kombu (core.keys: ``broker_queue_lists``, ``broker_binding_sets``,
``broker_binding_member``). If kombu stored a queue under other keys, a dead worker's messages would
outlive it and a worker restarted under its name would serve them.

Run against a real Redis with a Celery app configured as workers/celery_app.py configures it."""

from __future__ import annotations

import uuid

import redis
from celery import Celery
from kombu import Producer
from kombu.transport.redis import Channel

from core.keys import (
    KOMBU_BINDING_SETS,
    KOMBU_PRIORITY_STEPS,
    KOMBU_SEP,
    broker_binding_member,
    broker_binding_sets,
    broker_queue_lists,
)
from sluice.devstack import RedisServer
from tests.third_party.guard import drift, installed

KOMBU = installed("kombu")
CELERY = installed("celery")
WHERE = "router/reaper.py via core/keys.py (broker_queue_lists, broker_binding_sets, broker_binding_member)"


def test_the_layout_constants_are_kombus() -> None:
    assert Channel.sep == KOMBU_SEP, drift(KOMBU, "Channel.sep changed", WHERE, "kombu/transport/redis.py")
    assert tuple(Channel.priority_steps) == KOMBU_PRIORITY_STEPS, drift(
        KOMBU, "Channel.priority_steps changed", WHERE, "how kombu names a queue's priority lists (_q_for_pri)")
    binding_sets = (Channel.keyprefix_queue, getattr(Channel, "keyprefix_binding_permanent", None))
    assert binding_sets == KOMBU_BINDING_SETS, drift(
        KOMBU, f"the binding sets are now {binding_sets}", WHERE, "Channel._queue_bind and Channel._delete")


def test_a_worker_queue_lives_in_exactly_the_keys_the_reaper_deletes(redis_server: RedisServer) -> None:
    """A queue added the way workers/signals.py adds a worker's own queue (``select_add``), declared
    and given messages of every priority, lives in the lists and binding entries core.keys names;
    deleting those (what router/lua/reap.lua does) leaves kombu nothing of it."""
    tag = uuid.uuid4().hex[:8]
    pool_queue, worker_queue = f"guard.{tag}.m.agg", f"guard.{tag}.worker.w1"
    app = Celery("sluice-guard", broker=redis_server.url, set_as_current=False)
    app.conf.update(task_default_queue=pool_queue, broker_connection_retry_on_startup=True)
    app.amqp.queues.select_add(pool_queue)
    app.amqp.queues.select_add(worker_queue)
    client = redis.Redis.from_url(redis_server.url)
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        queue = app.amqp.queues[worker_queue](channel)
        queue.declare()
        producer = Producer(channel)
        for priority in range(10):
            producer.publish({"n": priority}, routing_key=worker_queue, exchange=queue.exchange.name,
                             priority=priority, serializer="json")
        assert channel._size(worker_queue) == 10
        lists, sets = broker_queue_lists(worker_queue), broker_binding_sets(pool_queue)
        member = broker_binding_member(worker_queue).encode()
        ours = {k.decode() for k in client.keys(f"*{worker_queue}*")}
        assert ours <= set(lists) | set(sets), drift(
            KOMBU, f"a queue is stored in keys the reaper does not know: {sorted(ours - set(lists) - set(sets))}",
            WHERE, "Channel._q_for_pri and Channel._queue_bind")
        assert sum(client.llen(k) for k in lists) == 10
        assert sum(1 for k in lists if client.llen(k)) == len(KOMBU_PRIORITY_STEPS)  # every priority's list
        for key in sets:
            assert member in client.smembers(key), drift(
                f"{CELERY} / {KOMBU}", f"the worker's queue is not bound to the pool queue's exchange in {key}",
                WHERE, "Celery's default exchange (task_default_exchange) and Queues.select_add")

        client.delete(*lists)
        for key in sets:
            client.srem(key, member)
        assert channel._size(worker_queue) == 0
        assert all(q != worker_queue for _, _, q in channel.get_table(pool_queue))
        assert client.keys(f"*{worker_queue}*") == []
    for key in client.keys(f"*guard.{tag}*"):
        client.delete(key)
    client.close()
