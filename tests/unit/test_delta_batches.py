"""Several token deltas in one pub/sub message (core.messages.join_deltas), and how the worker's
publisher groups a flush's deltas by channel (workers.publisher.group_by_channel)."""

from __future__ import annotations

import pytest

from core.messages import ErrorInfo, TokenDelta, Usage, decode_deltas, encode_delta, join_deltas
from workers.publisher import group_by_channel


@pytest.mark.parametrize("n", [1, 2, 15, 16, 300, 65536])
def test_joined_deltas_decode_in_order(n: int) -> None:
    deltas = [TokenDelta(f"r{i % 7}", i, [i, i + 1], finish_reason="stop" if i == n - 1 else None) for i in range(n)]
    assert decode_deltas(join_deltas([encode_delta(d) for d in deltas])) == deltas


def test_a_single_delta_message_still_decodes() -> None:
    """What a worker of an earlier release sends: one delta per message."""
    delta = TokenDelta("r", 3, [9], usage=Usage(4, 4), error=ErrorInfo("engine_dead", "gone"))
    assert decode_deltas(encode_delta(delta)) == [delta]


def _d(rid: str, seq: int) -> bytes:
    return encode_delta(TokenDelta(rid, seq, [seq]))


def test_each_channels_deltas_go_as_one_message_where_the_first_was() -> None:
    batch = [(False, "a", _d("x", 0)), (False, "b", _d("y", 0)), (True, "q", b"task"),
             (False, "a", _d("z", 0)), (False, "a", _d("x", 1)), (False, "b", _d("y", 1))]
    grouped = group_by_channel(batch)
    assert [(push, key) for push, key, _ in grouped] == [(False, "a"), (False, "b"), (True, "q")]
    assert [(d.request_id, d.seq) for d in decode_deltas(grouped[0][2])] == [("x", 0), ("z", 0), ("x", 1)]
    assert [(d.request_id, d.seq) for d in decode_deltas(grouped[1][2])] == [("y", 0), ("y", 1)]
    assert grouped[2] == (True, "q", b"task")


def test_a_batch_with_one_delta_per_channel_is_sent_as_it_is() -> None:
    batch = [(False, "a", _d("x", 0)), (True, "q", b"task"), (False, "b", _d("y", 0))]
    assert group_by_channel(batch) is batch
