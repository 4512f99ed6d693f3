"""Hand-packed Redis commands for the routing hot path (the index read and the decide script), the
one place that skips redis-py's command packer (router.resp_channel sends them).

Packing an ``MGET`` of 512 keys, or a script call with one argument per worker, through the client
costs more than Redis takes to answer it; the keys of a block chain all have the same length, so numpy
lays the whole command out at once (from a cached template of the constant bytes). Everything else
uses the client normally.
"""

from __future__ import annotations

import binascii
import functools
import struct
from collections.abc import Sequence

import numpy as np

#: ``str`` arguments up to this long are packed once and remembered (worker ids, key names and script
#: hashes repeat); pass one-off values (request ids, block chains) as ``bytes``.
_CACHED_STR_MAX = 200


@functools.lru_cache(maxsize=4096)
def _bulk_str(arg: str) -> bytes:
    data = arg.encode()
    return b"$%d\r\n%s\r\n" % (len(data), data)


def _bulk(arg: bytes | str | int) -> bytes:
    if isinstance(arg, str):
        if len(arg) <= _CACHED_STR_MAX:
            return _bulk_str(arg)
        arg = arg.encode()
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
