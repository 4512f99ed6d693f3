"""A stack with the routing state apart from the broker, for end-to-end tests, and the checks of where
its keys live.

Usage::

    with split_deployment("apart", redis_server.url, tokenizer_dir, MODEL,
                          workers={"p1": {"SLUICE_POOL": "prefill"}, "d1": {"SLUICE_POOL": "decode"}},
                          env={"SLUICE_ROUTER_MODE": "kv"}) as d:
        ...                                       # d.stack, d.broker, d.index, d.keys
        assert_routing_state_apart(d, MODEL, {"p1": "prefill", "d1": "decode"})

Two layouts: ``apart``, the routing state on a private ``redis-server`` of its own
(``SLUICE_INDEX_REDIS_URL``), and ``cluster``, on a private three-node Redis Cluster
(``SLUICE_REDIS__INDEX_CLUSTER=1``; keys with hash tags, core.keys). The broker is the caller's Redis;
each deployment has a namespace of its own, and leaving the ``with`` stops the stack, then the index.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import openai
import redis
from redis.cluster import RedisCluster

from bench.devstack import RedisServer, Stack
from core.keys import Keys, broker_binding_member
from tests.support.redis_topologies import RedisClusterNodes

LAYOUTS = ("apart", "cluster")


@dataclass
class SplitDeployment:
    """A running stack and clients of its two Redis planes."""

    stack: Stack
    broker: redis.Redis
    index: redis.Redis | RedisCluster
    keys: Keys
    layout: str

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.stack.base_url}/v1", api_key="unused", max_retries=0, timeout=60)

    def scan(self, plane: redis.Redis | RedisCluster) -> set[str]:
        """Every key of the namespace on ``plane`` (on a cluster: on every node)."""
        return {k.decode() for k in plane.scan_iter(match=f"{self.keys.prefix}:*", count=1000)}

    def index_blocks(self, worker: str, model: str) -> int:
        """How many blocks the prefix index lists for ``worker`` (its KV events, applied)."""
        return int(self.index.scard(self.keys.kv_worker(worker, model)))


@contextmanager
def split_deployment(layout: str, broker_url: str, model_path: Path, model: str,
                     workers: Mapping[str, Mapping[str, str]], env: Mapping[str, str]) -> Iterator[SplitDeployment]:
    """``sluice serve`` and one ``sluice worker`` per entry of ``workers`` (its own environment added to
    ``env``), the broker on ``broker_url`` and the routing state on a private Redis of ``layout``."""
    index_server: RedisServer | RedisClusterNodes
    if layout == "apart":
        index_server = RedisServer().start()
        plane_env = {"SLUICE_INDEX_REDIS_URL": index_server.url}
        index: redis.Redis | RedisCluster = redis.Redis.from_url(index_server.url)
    elif layout == "cluster":
        index_server = RedisClusterNodes().start()
        plane_env = {"SLUICE_INDEX_REDIS_URL": index_server.url, "SLUICE_REDIS__INDEX_CLUSTER": "1"}
        index = RedisCluster.from_url(index_server.url)
    else:
        raise ValueError(f"unknown layout {layout!r}: one of {LAYOUTS}")
    stack = Stack(redis_url=broker_url, namespace=f"split{uuid.uuid4().hex[:8]}", model_path=model_path,
                  env_extra={**env, **plane_env})
    broker = redis.Redis.from_url(broker_url)
    try:
        for name, worker_env in workers.items():
            stack.start_worker(name, **worker_env)
        stack.start_frontend()
        stack.wait_ready(model, workers=len(workers))
        yield SplitDeployment(stack, broker, index, Keys(stack.namespace, hash_tags=layout == "cluster"), layout)
    finally:
        stack.stop()
        broker.close()
        index.close()
        index_server.stop()


def bound(client: redis.Redis, keys: Keys, exchange: str, queue: str) -> bool:
    """Whether the broker binds Celery queue ``queue`` to ``exchange`` (kombu's binding sets)."""
    return any(client.sismember(name, broker_binding_member(queue)) for name in keys.broker_binding_sets(exchange))


def assert_routing_state_apart(d: SplitDeployment, model: str, pools: Mapping[str, str]) -> tuple[set[str], set[str]]:
    """Every routing key of ``pools``' workers (worker id -> pool) is on the index Redis and none on the
    broker; the broker holds the Celery queues, each worker's bound to its pool's exchange, and the
    frontends' leases, and the index none of them. Returns the keys seen (index, broker)."""
    k = d.keys
    on_index, on_broker = d.scan(d.index), d.scan(d.broker)

    routing = {k.workers, k.slots, k.worker_queues, k.kv_slot_owners_of(model), k.kv_slot_tags_of(model)}
    routing |= {name for w in pools for name in (k.worker(w), k.load(w))}
    routing |= {k.kv_worker(w, model) for w in pools if d.index_blocks(w, model)}
    assert routing <= on_index, routing - on_index
    assert any(name.startswith(k.kv_block_prefix(model)) for name in on_index)
    untagged = Keys(k.namespace)  # the names of a deployment on one Redis: none of those on the broker either
    assert not (routing | {untagged.workers, untagged.slots, untagged.worker_queues}) & on_broker
    assert not any(":kv:" in name or ":kvw:" in name or ":kvm:" in name or "inflight" in name or ":table:" in name
                   for name in on_broker)

    # The broker holds the Celery queues (kombu's bindings, under the broker prefix) and the frontends'
    # leases; the index holds none of them.
    broker_kinds = (k.broker_prefix, k.frontend_lease(""), k.frontends, k.token_channel(""))
    assert all(name.startswith(broker_kinds) for name in on_broker), sorted(on_broker)
    assert not any(name.startswith(broker_kinds) for name in on_index), sorted(on_index)
    for worker, pool in pools.items():
        assert bound(d.broker, k, k.pool_queue(model, pool), k.worker_queue(worker)), (worker, pool)
    assert k.frontends in on_broker
    return on_index, on_broker
