"""Hand-packed Redis commands for the routing hot path (the index read and the decide script), the
one place that skips redis-py's command packer.

Packing an ``MGET`` of 512 keys, or a script call with one argument per worker, through the client
costs more than Redis takes to answer it; the keys of a block chain all have the same length, so numpy
lays the whole command out at once (from a cached template of the constant bytes). The packed
commands go out on a pooled connection in one write, and the replies come back through the client's
own parser. Everything else uses the client normally.
"""

from __future__ import annotations

import binascii
import functools
import hashlib
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError


@functools.lru_cache(maxsize=65536)
def _bulk_str(arg: str) -> bytes:
    data = arg.encode()
    return b"$%d\r\n%s\r\n" % (len(data), data)


def _bulk(arg: bytes | str | int) -> bytes:
    if isinstance(arg, str):
        return _bulk_str(arg)  # ids, key names and script hashes repeat: packed once
    data = arg if isinstance(arg, bytes) else str(arg).encode()
    return b"$%d\r\n%s\r\n" % (len(data), data)


def pack_command(*args: bytes | str | int) -> bytes:
    """One command in RESP."""
    return b"*%d\r\n" % len(args) + b"".join([_bulk(a) for a in args])


def hex_digits(block_hashes: Sequence[int]) -> bytes:
    """16 lowercase hex digits per hash, big-endian (the block key suffix of ``Keys.kv_block``)."""
    return binascii.hexlify(struct.pack(f">{len(block_hashes)}Q", *block_hashes))


@functools.lru_cache(maxsize=64)
def _mget_rows(prefix: bytes, capacity: int) -> np.ndarray:
    """``capacity`` rows of ``$len\\r\\n{prefix}{16 hex digits}\\r\\n`` with the digits left blank."""
    head = b"$%d\r\n%s" % (len(prefix) + 16, prefix)
    rows = np.empty((capacity, len(head) + 18), dtype=np.uint8)
    rows[:, : len(head)] = np.frombuffer(head, dtype=np.uint8)
    rows[:, -2] = 13
    rows[:, -1] = 10
    rows.flags.writeable = False
    return rows


def pack_mget(prefix: bytes, block_hashes: Sequence[int], hexes: bytes | None = None) -> bytes:
    """``MGET`` of ``prefix`` + the 16 hex digits of each hash (``Keys.kv_block``), in RESP.
    ``hexes``: the hashes' :func:`hex_digits`, when the caller has them already."""
    n = len(block_hashes)
    digits = hex_digits(block_hashes) if hexes is None else hexes
    template = _mget_rows(prefix, 1 << max(n - 1, 0).bit_length())
    out = template[:n].copy()
    at = template.shape[1] - 18
    out[:, at: at + 16] = np.frombuffer(digits, dtype=np.uint8).reshape(n, 16)
    return b"*%d\r\n$4\r\nMGET\r\n" % (n + 1) + out.tobytes()


def pack_args(*args: bytes | str | int) -> bytes:
    """Arguments in RESP, without the command header (to join with other packed parts)."""
    return b"".join([_bulk(a) for a in args])


async def roundtrip(client: aioredis.Redis, packed: bytes, replies: int) -> list[Any]:
    """Send already-packed commands in one write and read their ``replies``. A broken connection (Redis
    restarted) is dropped and the commands sent once more on a fresh one."""
    pool = client.connection_pool
    for attempt in (1, 2):
        conn = await pool.get_connection()
        try:
            await conn.send_packed_command(packed)
            return [await conn.read_response() for _ in range(replies)]
        except (RedisConnectionError, RedisTimeoutError, OSError):
            await conn.disconnect()
            if attempt == 2:
                raise
        except BaseException:
            await conn.disconnect()  # replies may be left unread: the connection is unusable
            raise
        finally:
            await pool.release(conn)
    raise AssertionError("unreachable")


class PackedScript:
    """A Lua script called with hand-packed arguments (``EVALSHA``, loading it on ``NOSCRIPT``)."""

    def __init__(self, client: aioredis.Redis, source: str) -> None:
        self.client = client
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    async def __call__(self, keys: Sequence[str], args: Sequence[bytes | str | int]) -> Any:
        return await self.call_packed(len(keys), pack_args(*keys), len(args), pack_args(*args))

    async def call_packed(self, n_keys: int, packed_keys: bytes, n_args: int, packed_args: bytes) -> Any:
        """The call with keys and arguments already in RESP (:func:`pack_args`)."""
        packed = b"".join((b"*%d\r\n$7\r\nEVALSHA\r\n" % (3 + n_keys + n_args), _bulk_str(self.sha),
                           _bulk(n_keys), packed_keys, packed_args))
        try:
            (reply,) = await roundtrip(self.client, packed, 1)
        except NoScriptError:
            await self.client.script_load(self.source)
            (reply,) = await roundtrip(self.client, packed, 1)
        return reply

