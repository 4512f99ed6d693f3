"""redis-py's asyncio connections with a command write that never loses a cancellation.

Why: redis-py (8.1) bounds every command write with ``asyncio.wait_for(send(), socket_timeout)``. On
Python 3.11 ``wait_for`` runs the send as a task of its own and, when that task finishes in the same
loop turn as a cancellation of the caller, returns its result and drops the cancellation (CPython
gh-86296, fixed in 3.12 only). Every write takes a loop turn that way, so a cancel that arrives while
a command is being sent is lost more often than not: measured on the 2-core machine, 2,474 of 3,000
``GET`` calls cancelled at random points returned normally instead of raising ``CancelledError``
(tests/integration/test_redis_cancellation.py). A task cancelled then goes on as if nothing happened:
a heartbeat loop never ends and whoever awaits it hangs, an ``asyncio.timeout`` around Redis calls
does not fire. The extra task per write is also CPU on the hot path.

What: :class:`BoundedSend` replaces ``send_packed_command`` with the same steps (connect if needed,
health check, write, map failures as redis-py does and drop the connection on any failure) but waits
for the write buffer under ``asyncio.timeout`` on the caller's own task, which delivers every
cancellation. :func:`use_bounded_send` switches a pool, or a cluster client's node template, to the
matching class before it makes its first connection.

It overrides one method of redis-py's ``AbstractConnection`` and reads its ``_writer``; the tests
above fail if a redis-py release changes either.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.sentinel import SentinelManagedConnection, SentinelManagedSSLConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError


class BoundedSend:
    """The write of a command, bounded by ``socket_timeout`` with ``asyncio.timeout`` (module docstring)."""

    socket_timeout: float | None
    _writer: asyncio.StreamWriter | None

    async def send_packed_command(self, command: bytes | str | Iterable[bytes], check_health: bool = True) -> None:
        conn: Any = self
        if not conn.is_connected:
            await conn.connect_check_health(check_health=False)
        if check_health:
            await conn.check_health()
        if isinstance(command, str):
            command = command.encode()
        chunks = [command] if isinstance(command, bytes) else command
        try:
            assert self._writer is not None
            self._writer.writelines(chunks)
            # drain() returns at once unless the transport's buffer is above its high-water mark.
            async with asyncio.timeout(self.socket_timeout):
                await self._writer.drain()
        except TimeoutError:  # before OSError: the builtin TimeoutError is one
            await conn.disconnect(nowait=True)
            raise RedisTimeoutError("Timeout writing to socket") from None
        except OSError as exc:
            await conn.disconnect(nowait=True)
            raise RedisConnectionError(f"Error while writing to socket: {exc}") from exc
        except BaseException:
            # A write cut short (a cancellation) may have left part of a command on the socket.
            await conn.disconnect(nowait=True)
            raise


class Connection(BoundedSend, aioredis.Connection):
    pass


class UnixDomainSocketConnection(BoundedSend, aioredis.UnixDomainSocketConnection):
    pass


class SSLConnection(BoundedSend, aioredis.SSLConnection):
    pass


class SentinelConnection(BoundedSend, SentinelManagedConnection):
    pass


class SentinelSSLConnection(BoundedSend, SentinelManagedSSLConnection):
    pass


#: redis-py's class -> the same with the bounded write.
BOUNDED: dict[type, type] = {
    aioredis.Connection: Connection,
    aioredis.UnixDomainSocketConnection: UnixDomainSocketConnection,
    aioredis.SSLConnection: SSLConnection,
    SentinelManagedConnection: SentinelConnection,
    SentinelManagedSSLConnection: SentinelSSLConnection,
}


def bounded_class(cls: type) -> type:
    """The bounded-write class for redis-py's connection class ``cls`` (itself if it already is one)."""
    if issubclass(cls, BoundedSend):
        return cls
    try:
        return BOUNDED[cls]
    except KeyError:
        raise TypeError(f"no bounded-write connection class for {cls.__name__}") from None


def use_bounded_send(client: aioredis.Redis | RedisCluster) -> None:
    """Make every connection ``client`` opens from now on a bounded-write one (call before its first command)."""
    if isinstance(client, RedisCluster):
        template = client.nodes_manager.connection_kwargs
        template["connection_class"] = bounded_class(template.get("connection_class", aioredis.Connection))
        for node in client.nodes_manager.startup_nodes.values():
            node.connection_class = bounded_class(node.connection_class)
        return
    pool = client.connection_pool
    pool.connection_class = bounded_class(pool.connection_class)
