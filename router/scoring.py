"""KV-aware routing's block cost, and reading overlaps from the index's bitmaps. No I/O.

For each candidate worker ``w`` (block size ``B_w``) and a prompt of ``T`` tokens::

    prompt_w  = ceil(T / B_w)                      blocks the request occupies on w
    overlap_w = leading prompt blocks w holds      (router.prefix_index)
    prefill_w = prompt_w − overlap_w + queued_w    queued_w: prefill already routed to w, not yet done
    decode_w  = max(active_w, predicted_w)         active_w: heartbeat; predicted_w: routers' in-flight sum
    cost_w    = (B_w / B_min) × (weight × prefill_w + decode_w)

``decode_w`` takes the larger of the two views instead of their sum: a running request is in both
(the engine's active blocks and the routers' prediction until it is released), and counting it twice
would double the load term. The routers' view is the fresh one (it includes requests still queued and
those routed a moment ago by any frontend), the heartbeat the complete one (it includes traffic that
did not come through a KV router). ``B_w / B_min`` makes block counts of workers with different block
sizes comparable (in blocks of the smallest size); it is 1 when all sizes agree.

The costs and the pick are computed in Redis, by the deciding script (router/lua/decide.lua), for
routed requests and for the standalone router's queries alike; tests/router/cost_oracle.py holds an
independent numpy version as the tests' oracle.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence

import numpy as np


def leading_overlaps(bitmaps: Sequence[bytes], slots: Sequence[int] | np.ndarray) -> np.ndarray:
    """``overlap[j]`` = the number of leading bitmaps with bit ``slots[j]`` set.

    ``bitmaps[i]`` is the bitmap of the prompt's block ``i`` as Redis stores it: bit ``s`` is
    ``0x80 >> (s % 8)`` of byte ``s // 8``, and bytes past its end read as zero. The list stops at
    the first block nobody holds, so a slot holding every bitmap has overlap = ``len(bitmaps)``.

    Consecutive blocks of a prompt are almost always held by the same workers, so only the blocks
    where the bitmap changes are looked at: the bits still held (ANDed down the chain, as one
    Python int) can only drop out there, and a bit that drops out at block ``i`` has overlap ``i``.
    The cost is one comparison per block plus a few numpy calls, whatever the number of slots."""
    slot_arr = np.asarray(slots, dtype=np.int64)
    n = len(bitmaps)
    if n == 0 or slot_arr.size == 0:
        return np.zeros(slot_arr.size, dtype=np.int64)
    width = int(slot_arr.max()) // 8 + 1
    changes = [0]
    if bitmaps.count(bitmaps[0]) != n:
        changes += itertools.compress(range(1, n), map(operator.ne, bitmaps[1:], bitmaps))
    held = (1 << (8 * width)) - 1
    gone_rows: list[bytes] = []
    gone_at: list[int] = []
    for i in changes:
        row = bitmaps[i][:width]
        bits = int.from_bytes(row, "big") << (8 * (width - len(row)))
        gone = held & ~bits
        if gone:
            gone_rows.append(gone.to_bytes(width, "big"))
            gone_at.append(i)
            held &= bits
            if not held:
                break
    counts = np.full(8 * width, n, dtype=np.int64)
    if gone_rows:
        dropped = np.unpackbits(np.frombuffer(b"".join(gone_rows), dtype=np.uint8).reshape(-1, width), axis=1)
        first = dropped.argmax(axis=0)  # each bit drops out at most once
        counts = np.where(dropped.any(axis=0), np.asarray(gone_at, dtype=np.int64)[first], counts)
    return counts[slot_arr]


def prompt_blocks(n_tokens: int, block_size: int | np.ndarray) -> int | np.ndarray:
    """Blocks a prompt of ``n_tokens`` occupies, the partial last block included (elementwise)."""
    return -(-n_tokens // block_size)
