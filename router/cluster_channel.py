"""The routing hot path's channel (router.resp_channel) for routing state on a Redis Cluster.

Usage::

    channel = routing_channel(client)   # a RespChannel, or a ClusterChannel for a RedisCluster client
    replies = await channel.call(packed, 2)

A :class:`ClusterChannel` keeps one :class:`~router.resp_channel.RespChannel` per primary and sends
each call to the primary of the hash slot of the first key of its first command (the key after
``numkeys`` for ``EVALSHA``). Every call the routers make touches one slot only: the deciding
script, the releases and the index read name one model's keys, which share its hash tag (core.keys).
After a ``MOVED`` or ``ASK`` reply (the cluster was resharded, a replica promoted) or a lost
connection, the slot map is read again and the call sent once more.
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError, SlotNotCoveredError

from core.redis_connection import use_bounded_send
from router.resp_channel import RespChannel

#: Error replies after which the slot map is read again.
_REDIRECTS = ("MOVED", "ASK", "CLUSTERDOWN", "TRYAGAIN")


def _bulk_at(packed: bytes, at: int) -> tuple[bytes, int]:
    """The bulk string starting at ``at`` (``$len\\r\\ndata\\r\\n``) and where the next one starts."""
    end = packed.index(b"\r\n", at)
    n = int(packed[at + 1:end])
    return packed[end + 2:end + 2 + n], end + 4 + n


def first_key(packed: bytes) -> bytes | None:
    """The key the first command of ``packed`` (commands in RESP) names first; None if it names none."""
    at = packed.index(b"\r\n") + 2  # past '*N'
    count = int(packed[1:at - 2])
    command, at = _bulk_at(packed, at)
    if command.upper() in (b"EVALSHA", b"EVAL"):
        if count < 4:
            return None
        _, at = _bulk_at(packed, at)
        numkeys, at = _bulk_at(packed, at)
        return _bulk_at(packed, at)[0] if int(numkeys) > 0 else None
    return _bulk_at(packed, at)[0] if count > 1 else None


class ClusterChannel:
    """A :class:`~router.resp_channel.RespChannel` per cluster primary (see the module docstring)."""

    def __init__(self, client: RedisCluster) -> None:
        #: The cluster client: ``SCRIPT LOAD`` after ``NOSCRIPT`` goes through it (to every primary).
        self.client = client
        self._channels: dict[str, RespChannel] = {}
        self._ready = False
        self._lock = asyncio.Lock()

    @property
    def writes(self) -> int:
        return sum(c.writes for c in self._channels.values())

    async def call(self, packed: bytes, replies: int) -> list[Any]:
        key = first_key(packed)
        for attempt in (1, 2):
            node = await self._node(key)
            try:
                return await self._channel(node).call(packed, replies)
            except (ResponseError, RedisConnectionError) as exc:
                moved = isinstance(exc, RedisConnectionError) or str(exc).startswith(_REDIRECTS)
                if attempt == 2 or not moved:
                    raise
                await self._refresh()
        raise AssertionError("unreachable")

    async def _node(self, key: bytes | None) -> ClusterNode:
        if not self._ready:
            await self._refresh()
        if key is None:
            return self.client.get_random_node()
        node = self.client.get_node_from_key(key.decode())
        if node is None:
            raise SlotNotCoveredError(f"no cluster node serves key {key!r}")
        return node

    async def _refresh(self) -> None:
        async with self._lock:
            if self._ready:
                await self.client.nodes_manager.initialize()
            else:
                await self.client.initialize()
                self._ready = True

    def _channel(self, node: ClusterNode) -> RespChannel:
        channel = self._channels.get(node.name)
        if channel is None:
            kw = node.connection_kwargs
            client = aioredis.Redis(host=node.host, port=int(node.port), username=kw.get("username"),
                                    password=kw.get("password"),
                                    socket_connect_timeout=kw.get("socket_connect_timeout"))
            use_bounded_send(client)  # its pool serves the calls the channel does not take over
            channel = self._channels[node.name] = RespChannel(client)
        return channel

    async def aclose(self) -> None:
        for channel in self._channels.values():
            await channel.aclose()
            await channel.client.aclose()
        self._channels.clear()


def routing_channel(client: aioredis.Redis | RedisCluster) -> RespChannel | ClusterChannel:
    """The routing hot path's channel to the Redis that holds the routing state."""
    return ClusterChannel(client) if isinstance(client, RedisCluster) else RespChannel(client)
