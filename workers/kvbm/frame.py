"""A stored block's frame: its checksum, bound to the block's hash, then its bytes. Pure.

A frame read back is trusted only if its checksum matches the bytes *and* the hash it was asked for, so
a torn write, a flipped bit or a block filed under the wrong name reads as a miss (then recomputed).
"""

from __future__ import annotations

import struct

import xxhash

_HEAD = struct.Struct("<QQ")  # checksum, block hash (unsigned 64-bit)
_MASK = (1 << 64) - 1


def _checksum(block_hash: int, payload: bytes | memoryview) -> int:
    h = xxhash.xxh3_64(seed=block_hash & _MASK)
    h.update(payload)
    return h.intdigest()


def seal(block_hash: int, payload: bytes | memoryview) -> bytes:
    """The frame that stores ``payload`` as block ``block_hash``."""
    return _HEAD.pack(_checksum(block_hash, payload), block_hash & _MASK) + bytes(payload)


def unseal(block_hash: int, frame: bytes | None) -> bytes | None:
    """The payload of ``frame`` if it is block ``block_hash``, intact; None otherwise."""
    if frame is None or len(frame) < _HEAD.size:
        return None
    checksum, stored_hash = _HEAD.unpack_from(frame)
    if stored_hash != block_hash & _MASK:
        return None
    payload = memoryview(frame)[_HEAD.size:]
    if _checksum(block_hash, payload) != checksum:
        return None
    return bytes(payload)


def frame_size(payload_bytes: int) -> int:
    """The bytes a frame of ``payload_bytes`` takes."""
    return _HEAD.size + payload_bytes
