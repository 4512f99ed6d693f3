"""Block hashing: the one pure function that names KV blocks for the router and every engine.

A prompt is cut into blocks of ``block_size`` tokens; a partial last block is not hashed.
With ``H(data, seed)`` = xxh3-64 of ``data`` under the 64-bit ``seed`` and ``b(tokens)`` the
little-endian uint32 bytes of the token ids::

    root   = H(b"sluice-kv-v1|" + model + "|" + (lora or "") + "|" + (extra or ""), 0)
    h_0    = H(b(tokens[0:B]), root)
    h_i    = H(b(tokens[i*B:(i+1)*B]), h_{i-1})

so ``h_i`` names the whole prefix ``tokens[0:(i+1)*B]``: two prompts share ``h_i`` exactly when
they share that prefix under the same model, adapter and extra salt (e.g. multimodal content).
"""

from __future__ import annotations

import array
import sys
from collections.abc import Sequence
from typing import NewType, cast

import numpy as np
import xxhash

BlockHash = NewType("BlockHash", int)

_HASH_VERSION = b"sluice-kv-v1"


def root_hash(model: str, lora: str | None = None, extra: str | None = None) -> BlockHash:
    """The seed of a hash chain: separates models, LoRA adapters and extra salt."""
    salt = b"|".join((_HASH_VERSION, model.encode(), (lora or "").encode(), (extra or "").encode()))
    return BlockHash(xxhash.xxh3_64_intdigest(salt, 0))


def token_bytes(token_ids: Sequence[int] | np.ndarray | bytes) -> bytes:
    """``b(tokens)``: the token ids as little-endian uint32 bytes (``bytes`` pass through as such).

    A list goes through ``array.array``, about five times faster than numpy's conversion of a list."""
    if isinstance(token_ids, bytes):
        return token_ids
    if isinstance(token_ids, np.ndarray):
        return token_ids.astype("<u4", copy=False).tobytes()
    packed = array.array("I", token_ids)
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tobytes()


def block_hashes(
    token_ids: Sequence[int] | np.ndarray | bytes,
    block_size: int,
    root: int,
    *,
    start_block: int = 0,
    parent: int | None = None,
) -> list[BlockHash]:
    """Chained hashes of the full blocks of ``token_ids`` (or of their :func:`token_bytes`).

    ``start_block``/``parent`` continue an existing chain: hash blocks from ``start_block`` on,
    with ``parent`` the hash of block ``start_block - 1`` (``root`` when ``start_block`` is 0).

    The chain is sequential by construction (each hash seeds the next), so the loop stays in
    Python; it does the least per block: one slice of one ``bytes`` and one xxh3 call (no
    per-block wrapper objects; ``BlockHash`` is a plain ``int`` at run time).
    """
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    if start_block > 0 and parent is None:
        raise ValueError("parent is required when start_block > 0")
    data = token_bytes(token_ids)
    step = block_size * 4
    n_blocks = len(data) // step
    if start_block >= n_blocks:
        return []
    h = root if start_block == 0 or parent is None else parent
    digest = xxhash.xxh3_64_intdigest
    out: list[int] = []
    append = out.append
    for block in [data[i:i + step] for i in range(start_block * step, n_blocks * step, step)]:
        h = digest(block, h)
        append(h)
    return cast(list[BlockHash], out)
