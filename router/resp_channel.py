"""A lean, pipelined Redis connection for the routing hot path (the deciding script, releases and
the standalone router's index read).

Usage::

    channel = RespChannel(client)             # the client's own settings: host/port or socket, db, auth
    replies = await channel.call(packed, 2)   # commands already in RESP (router.resp), their replies
    await channel.aclose()

Why: a round trip through redis-py's asyncio client costs about 120 µs of client CPU on the 2-core
machine this was measured on (connection pool checkout, its observability hooks, a stream reader and
writer, timeouts), against about 20 µs for the same PING written straight to an asyncio transport and
parsed by hiredis. A routing decision is one round trip, so that difference is a large part of it.

How: one connection per channel, opened on first use on the running event loop and shared by every
caller of the channel. Calls are pipelined: each writes its packed commands in one ``write`` and gets
its replies in order (Redis answers a connection's commands in the order it receives them), so many
requests routing at once share the connection without waiting for each other. Error replies come back
as redis-py exceptions (``NOSCRIPT`` as :class:`~redis.exceptions.NoScriptError`); the first one in a
call's replies is raised, as redis-py does.

Invariants:

* A reply always belongs to the oldest call still waiting: a call cancelled while it waits leaves its
  slot in the queue, and its replies are read and dropped when they arrive.
* A lost connection fails every waiting call with :class:`~redis.exceptions.ConnectionError`; the
  next call opens a new one. :meth:`call` sends once more on a fresh connection when the connection
  failed under it (the scripts sent here are safe to repeat: see router.inflight).
* Connections the channel cannot reproduce exactly (TLS, or a pool whose connection class is not
  redis-py's own plain TCP or Unix socket class, such as a test's counting subclass) are not taken
  over: those calls go through the client's pool, with the same packed bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections import deque
from collections.abc import Sequence
from typing import Any, Protocol, cast

import hiredis
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from core import redis_connection
from router.resp import pack_args, pack_command

#: The connection classes whose settings the channel knows how to reproduce.
_PLAIN_CLASSES = (aioredis.Connection, aioredis.UnixDomainSocketConnection, redis_connection.Connection,
                  redis_connection.UnixDomainSocketConnection)


def _reply_error(message: str) -> ResponseError:
    return (NoScriptError if message.startswith("NOSCRIPT") else ResponseError)(message)


def _raise_first_error(replies: list[Any]) -> list[Any]:
    for reply in replies:
        if isinstance(reply, ResponseError):
            raise reply
    return replies


class _Pending:
    """One call waiting for its replies."""

    __slots__ = ("future", "expected", "replies")

    def __init__(self, future: asyncio.Future[list[Any]], expected: int) -> None:
        self.future = future
        self.expected = expected
        self.replies: list[Any] = []


class _RespProtocol(asyncio.Protocol):
    def __init__(self) -> None:
        self._reader = hiredis.Reader(replyError=_reply_error)
        self._waiting: deque[_Pending] = deque()
        self._transport: asyncio.Transport | None = None
        self.lost: Exception | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's

    def request(self, packed: bytes, expected: int) -> asyncio.Future[list[Any]]:
        if self.lost is not None or self._transport is None:
            raise RedisConnectionError(f"the routing connection to Redis is closed: {self.lost}")
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._waiting.append(_Pending(future, expected))
        self._transport.write(packed)
        return future

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        reader.feed(data)
        try:
            while self._waiting:
                reply = reader.gets()
                if reply is False:
                    return
                head = self._waiting[0]
                head.replies.append(reply)
                if len(head.replies) == head.expected:
                    self._waiting.popleft()
                    if not head.future.done():
                        head.future.set_result(head.replies)
        except hiredis.ProtocolError as exc:  # the stream cannot be trusted any more
            self._fail(RedisConnectionError(f"Redis protocol error: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(RedisConnectionError(f"connection to Redis lost: {exc or 'closed'}"))

    def _fail(self, error: Exception) -> None:
        self.lost = self.lost or error
        while self._waiting:
            pending = self._waiting.popleft()
            if not pending.future.done():
                pending.future.set_exception(error)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


class RespChannel:
    """One pipelined connection to the client's Redis for already-packed commands (see the module
    docstring). Cheap to create: it connects on first use."""

    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client
        pool = client.connection_pool
        kwargs = pool.connection_kwargs
        #: False: calls go through the client's pool (a connection this channel cannot reproduce).
        self.direct = pool.connection_class in _PLAIN_CLASSES and not kwargs.get("ssl")
        #: Writes sent (one per call; a resend counts again): one write is one round trip.
        self.writes = 0
        self._protocol: _RespProtocol | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._opening: asyncio.Lock | None = None

    async def call(self, packed: bytes, replies: int) -> list[Any]:
        """Send ``packed`` (``replies`` commands, already in RESP) in one write and return their
        replies; raises the first error reply. Sent once more on a fresh connection if the
        connection failed."""
        for attempt in (1, 2):
            try:
                return _raise_first_error(await self._roundtrip(packed, replies))
            except (RedisConnectionError, RedisTimeoutError, OSError):
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    async def _roundtrip(self, packed: bytes, replies: int) -> list[Any]:
        self.writes += 1
        if not self.direct:
            return await _through_pool(self.client, packed, replies)
        protocol = await self._connection()
        return await protocol.request(packed, replies)

    def _usable(self, loop: asyncio.AbstractEventLoop) -> _RespProtocol | None:
        """The open connection, if it is alive and belongs to ``loop``."""
        protocol = self._protocol
        return protocol if protocol is not None and protocol.lost is None and self._loop is loop else None

    async def _connection(self) -> _RespProtocol:
        loop = asyncio.get_running_loop()
        if (protocol := self._usable(loop)) is not None:
            return protocol
        if self._opening is None or self._loop is not loop:
            self._opening = asyncio.Lock()
        async with self._opening:
            if (protocol := self._usable(loop)) is not None:
                return protocol
            if self._protocol is not None:
                self._protocol.close()
            self._protocol = await self._open(loop)
            self._loop = loop
            return self._protocol

    async def _open(self, loop: asyncio.AbstractEventLoop) -> _RespProtocol:
        kwargs = self.client.connection_pool.connection_kwargs
        timeout = kwargs.get("socket_connect_timeout")
        if "path" in kwargs:
            connect = loop.create_unix_connection(_RespProtocol, kwargs["path"])
        else:
            connect = loop.create_connection(_RespProtocol, kwargs.get("host", "localhost"), kwargs.get("port", 6379))
        try:
            async with asyncio.timeout(timeout):  # not wait_for: a cancel during the connect is never lost
                transport, protocol = await connect
        except (TimeoutError, OSError) as exc:
            raise RedisConnectionError(f"cannot connect to Redis for routing: {exc}") from exc
        handshake = []
        password, username = kwargs.get("password"), kwargs.get("username")
        if password:
            handshake.append(pack_command("AUTH", username, password) if username else pack_command("AUTH", password))
        if kwargs.get("db"):
            handshake.append(pack_command("SELECT", int(kwargs["db"])))
        if handshake:
            try:
                _raise_first_error(await protocol.request(b"".join(handshake), len(handshake)))
            except BaseException:
                transport.close()
                raise
        return protocol

    async def aclose(self) -> None:
        if self._protocol is not None:
            self._protocol.close()
            self._protocol = None


async def _through_pool(client: aioredis.Redis, packed: bytes, replies: int) -> list[Any]:
    """The same round trip on a connection of the client's pool."""
    pool = client.connection_pool
    conn = await pool.get_connection()  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
    try:
        await conn.send_packed_command(packed)
        return [await conn.read_response(disable_decoding=True) for _ in range(replies)]
    except BaseException:
        with contextlib.suppress(Exception):
            await conn.disconnect()  # broken, or replies left unread: the connection is unusable
        raise
    finally:
        await pool.release(conn)


class Channel(Protocol):
    """What a script needs of a channel: a packed call, and the client that loads scripts."""

    client: Any

    async def call(self, packed: bytes, replies: int) -> list[Any]: ...


class PackedScript:
    """A Lua script called through a channel with hand-packed arguments (``EVALSHA``, loading the
    script on ``NOSCRIPT``)."""

    def __init__(self, channel: Channel, source: str) -> None:
        self.channel = channel
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    async def __call__(self, keys: Sequence[str], args: Sequence[bytes | str | int]) -> Any:
        return await self.call_packed(len(keys), pack_args(*keys), len(args), pack_args(*args))

    async def call_packed(self, n_keys: int, packed_keys: bytes, n_args: int, packed_args: bytes) -> Any:
        """The call with keys and arguments already in RESP (:func:`router.resp.pack_args`)."""
        packed = b"".join((b"*%d\r\n$7\r\nEVALSHA\r\n" % (3 + n_keys + n_args), pack_args(self.sha, n_keys),
                           packed_keys, packed_args))
        try:
            (reply,) = await self.channel.call(packed, 1)
        except NoScriptError:
            await self.channel.client.script_load(self.source)
            (reply,) = await self.channel.call(packed, 1)
        return reply
