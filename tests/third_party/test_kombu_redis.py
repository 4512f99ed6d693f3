"""kombu's Redis transport: how it stores a queue, which the reaper (router.reaper) deletes for a gone
worker by key, without kombu, and which the frontend pushes onto by hand (core.keys: ``Keys.broker_prefix``,
``Keys.broker_queue_lists``, ``Keys.broker_binding_sets``, ``broker_binding_member``). If kombu stored a
queue under other keys, a dead worker's messages would outlive it and a worker restarted under its name
would serve them; if its ``global_keyprefix`` missed a key or a pub/sub channel, two namespaces on one
Redis would share it (their workers would answer each other's Flower and ``celery inspect``).

Run against a real Redis with a Celery app configured as workers/celery_app.py configures it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from celery import Celery
from kombu import Consumer, Exchange, Producer, Queue
from kombu.transport.redis import Channel

from bench.devstack import RedisServer
from core.keys import KOMBU_BINDING_SETS, KOMBU_PRIORITY_STEPS, KOMBU_SEP, Keys, broker_binding_member
from tests.third_party.guard import drift, installed

KOMBU = installed("kombu")
CELERY = installed("celery")
WHERE = "router/reaper.py and app/requests/enqueue.py via core/keys.py (Keys.broker_*, broker_binding_member)"
ISOLATION = "workers/celery_app.py (global_keyprefix = Keys.broker_prefix): namespaces on one Redis"


def _app(url: str, keys: Keys, pool_queue: str) -> Celery:
    """A Celery app with the broker settings of workers/celery_app.py."""
    app = Celery("sluice-guard", broker=url, set_as_current=False)
    app.conf.update(task_default_queue=pool_queue, broker_connection_retry_on_startup=True,
                    broker_transport_options={"visibility_timeout": 3600, "global_keyprefix": keys.broker_prefix})
    return app


@pytest.fixture
def keys(namespace: str) -> Keys:
    return Keys(namespace)


@pytest.fixture
def client(redis_client: redis.Redis) -> redis.Redis:
    """The session's Redis; ``redis_client`` deletes the namespace's keys afterwards."""
    return redis_client


def test_the_layout_constants_are_kombus() -> None:
    assert Channel.sep == KOMBU_SEP, drift(KOMBU, "Channel.sep changed", WHERE, "kombu/transport/redis.py")
    assert tuple(Channel.priority_steps) == KOMBU_PRIORITY_STEPS, drift(
        KOMBU, "Channel.priority_steps changed", WHERE, "how kombu names a queue's priority lists (_q_for_pri)")
    binding_sets = (Channel.keyprefix_queue, getattr(Channel, "keyprefix_binding_permanent", None))
    assert binding_sets == KOMBU_BINDING_SETS, drift(
        KOMBU, f"the binding sets are now {binding_sets}", WHERE, "Channel._queue_bind and Channel._delete")


def test_a_worker_queue_lives_in_exactly_the_keys_the_reaper_deletes(redis_server: RedisServer, keys: Keys,
                                                                      client: redis.Redis) -> None:
    """A queue added the way workers/signals.py adds a worker's own queue (``select_add``), declared
    and given messages of every priority, lives in the lists and binding entries core.keys names, under
    the namespace's broker prefix; deleting those (what router/lua/reap.lua does) leaves kombu nothing
    of it."""
    pool_queue, worker_queue = keys.pool_queue("m", "agg"), keys.worker_queue("w1")
    app = _app(redis_server.url, keys, pool_queue)
    app.amqp.queues.select_add(pool_queue)
    app.amqp.queues.select_add(worker_queue)
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        queue = app.amqp.queues[worker_queue](channel)
        queue.declare()
        producer = Producer(channel)
        for priority in range(10):
            producer.publish({"n": priority}, routing_key=worker_queue, exchange=queue.exchange.name,
                             priority=priority, serializer="json")
        assert channel._size(worker_queue) == 10
        lists, sets = keys.broker_queue_lists(worker_queue), keys.broker_binding_sets(pool_queue)
        member = broker_binding_member(worker_queue).encode()
        ours = {k.decode() for k in client.keys(f"*{worker_queue}*")}
        assert ours <= set(lists) | set(sets), drift(
            KOMBU, f"a queue is stored in keys the reaper does not know: {sorted(ours - set(lists) - set(sets))}",
            WHERE, "Channel._q_for_pri, Channel._queue_bind and GlobalKeyPrefixMixin")
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


def test_a_message_pushed_by_hand_is_the_consumers(redis_server: RedisServer, keys: Keys, client: redis.Redis) -> None:
    """What the frontend ``LPUSH``es onto ``Keys.broker_queue_list(queue)`` is what a consumer of ``queue``
    (kombu with the namespace's prefix) takes next."""
    queue = keys.worker_queue("w1")
    app = _app(redis_server.url, keys, keys.pool_queue("m", "agg"))
    with app.connection_for_read() as conn:
        simple = conn.SimpleQueue(queue, serializer="json")
        simple.put({"from": "kombu"})
        client.lpush(keys.broker_queue_list(queue), client.rpop(keys.broker_queue_list(queue)))
        message = simple.get(timeout=5)
        assert message.payload == {"from": "kombu"}, drift(KOMBU, "a prefixed queue is read elsewhere", WHERE,
                                                           "GlobalKeyPrefixMixin, Channel._brpop_start")
        message.ack()
        simple.close()


@pytest.fixture
def private_redis() -> Iterator[RedisServer]:
    """A Redis of the test's own: what is on it, only the test put there."""
    server = RedisServer().start()
    yield server
    server.stop()


def _drain(conn, timeout: float = 0.3) -> None:  # noqa: ANN001 - a kombu Connection
    try:
        conn.drain_events(timeout=timeout)
    except TimeoutError:
        pass


def test_two_prefixes_share_no_key_and_no_channel(private_redis: RedisServer) -> None:
    """Two namespaces' brokers on one Redis, each doing what Celery does there (queues, an unacknowledged
    message with ack emulation, remote control's broadcast and replies, task events): every key and
    every published channel is under one of the two prefixes, and a fanout exchange of the same name
    (``celery.pidbox``, ``celeryev``) delivers to its own namespace only."""
    url = private_redis.url
    a, b = Keys("a"), Keys("b")
    apps = {k: _app(url, k, k.pool_queue("m", "agg")) for k in (a, b)}
    observer = redis.Redis.from_url(url).pubsub()
    observer.psubscribe("*")
    got: dict[str, list] = {"a": [], "b": []}
    fanout = Exchange("celery.pidbox", type="fanout")
    conns = {k: apps[k].connection_for_write() for k in (a, b)}
    try:
        consumers = {}
        for k, conn in conns.items():
            consumers[k] = Consumer(conn.channel(), [Queue(f"{k.namespace}.fan", fanout, auto_delete=True)],
                                    callbacks=[lambda body, msg, ns=k.namespace: (got[ns].append(body), msg.ack())],
                                    accept=["json"])
            consumers[k].consume()
            _drain(conn)  # subscribes (kombu subscribes when it first polls)
        Producer(conns[b].channel()).publish({"to": "b"}, exchange=fanout, serializer="json")
        _drain(conns[a])
        _drain(conns[b])
        assert got == {"a": [], "b": [{"to": "b"}]}, drift(
            KOMBU, "a fanout message crossed namespaces", ISOLATION, "PrefixedRedisPubSub, GlobalKeyPrefixMixin")

        for k, app in apps.items():
            # Taken, not acknowledged (ack emulation on): the message waits in the unacked hash and index.
            simple = conns[k].SimpleQueue(k.worker_queue("w1"), serializer="json")
            simple.put({"n": 1})
            simple.get(timeout=5)
            app.control.broadcast("ping", reply=True, timeout=0.2)
            with app.events.default_dispatcher() as dispatcher:
                dispatcher.send("worker-heartbeat")

        prefixes = (a.broker_prefix.encode(), b.broker_prefix.encode())
        every_key = redis.Redis.from_url(url).keys("*")
        assert a.broker_prefix.encode() + b"unacked" in every_key
        strays = [key for key in every_key if not key.startswith(prefixes)]
        assert strays == [], drift(KOMBU, f"keys outside the namespaces' prefixes: {strays}", ISOLATION,
                                   "GlobalKeyPrefixMixin.PREFIXED_*_COMMANDS")
        channels = set()
        while (message := observer.get_message(timeout=0.2)) is not None:
            if message["type"] == "pmessage":
                channels.add(message["channel"])
        assert channels, "nothing was published"
        strays = sorted(c for c in channels if not c.startswith(prefixes))
        assert strays == [], drift(KOMBU, f"channels outside the namespaces' prefixes: {strays}", ISOLATION,
                                   "GlobalKeyPrefixMixin (PUBLISH), PrefixedRedisPubSub")
        assert any(b"celery.pidbox" in c for c in channels) and any(b"celeryev" in c for c in channels)
    finally:
        for conn in conns.values():
            conn.release()
        observer.close()
        for app in apps.values():
            app.close()
