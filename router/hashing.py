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

from collections.abc import Sequence
from typing import NewType

import numpy as np
import xxhash

BlockHash = NewType("BlockHash", int)

_HASH_VERSION = b"sluice-kv-v1"


def root_hash(model: str, lora: str | None = None, extra: str | None = None) -> BlockHash:
    """The seed of a hash chain: separates models, LoRA adapters and extra salt."""
    salt = b"|".join((_HASH_VERSION, model.encode(), (lora or "").encode(), (extra or "").encode()))
    return BlockHash(xxhash.xxh3_64_intdigest(salt, 0))


def block_hashes(
    token_ids: Sequence[int] | np.ndarray,
    block_size: int,
    root: int,
    *,
    start_block: int = 0,
    parent: int | None = None,
) -> list[BlockHash]:
    """Chained hashes of the full blocks of ``token_ids``.

    ``start_block``/``parent`` continue an existing chain: hash blocks from ``start_block`` on,
    with ``parent`` the hash of block ``start_block - 1`` (``root`` when ``start_block`` is 0).
    """
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    tokens = np.asarray(token_ids, dtype=np.uint32)
    n_blocks = len(tokens) // block_size
    if start_block >= n_blocks:
        return []
    data = tokens[: n_blocks * block_size].astype("<u4", copy=False).tobytes()
    step = block_size * 4
    h = root if start_block == 0 or parent is None else parent
    if start_block > 0 and parent is None:
        raise ValueError("parent is required when start_block > 0")
    out: list[BlockHash] = []
    digest = xxhash.xxh3_64_intdigest
    view = memoryview(data)
    for i in range(start_block, n_blocks):
        h = digest(view[i * step : (i + 1) * step], h)
        out.append(BlockHash(h))
    return out
