"""RequestStream.get_batch against the loop's scheduling: what a reader waiting on a stream sees."""

from __future__ import annotations

import asyncio

import pytest

from app.requests.streams import RequestStream
from core.messages import TokenDelta


async def test_a_cancel_in_the_turn_a_delta_arrives_is_not_lost() -> None:
    """The client leaves in the loop turn in which the worker's start notice wakes the reader: the
    reader is cancelled (it must not return the batch and carry on streaming for nobody)."""
    stream = RequestStream("r", None)
    reader = asyncio.create_task(stream.get_batch(30))
    await asyncio.sleep(0)  # the reader waits
    stream._push(TokenDelta("r", 0, worker_id="w1", started_at=1.0))
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader


async def test_a_batch_holds_every_delta_that_arrived() -> None:
    stream = RequestStream("r", "w1")
    reader = asyncio.create_task(stream.get_batch(30))
    await asyncio.sleep(0)
    for seq in range(3):
        stream._push(TokenDelta("r", seq, token_ids=[seq]))
    assert [d.seq for d in await reader] == [0, 1, 2]


async def test_nothing_in_time_is_a_timeout() -> None:
    with pytest.raises(TimeoutError):
        await RequestStream("r", "w1").get_batch(0.01)


def test_a_second_copy_of_a_delivered_delta_is_dropped_and_the_stream_goes_on() -> None:
    """A disaggregated stream whose prefill worker's first token arrives twice (a publish Redis ran twice):
    the copy is dropped, the decode worker's tokens follow it, and no gap is reported."""
    stream = RequestStream("r", "p1")
    stream.handoff_to = "d1"
    stream._push(TokenDelta("r", 0, [5], worker_id="p1"))
    stream._push(TokenDelta("r", 0, [5], worker_id="p1"))
    stream._push(TokenDelta("r", 1, [6]))
    stream._push(TokenDelta("r", 1, [6]))
    stream._push(TokenDelta("r", 2, [7], finish_reason="length"))
    batch = list(stream._items)
    assert [(d.seq, d.token_ids, d.error) for d in batch] == [(0, [5], None), (1, [6], None), (2, [7], None)]
    assert stream.worker_id == "d1" and stream.closed


def test_a_skipped_seq_is_still_a_gap() -> None:
    stream = RequestStream("r", "w1")
    stream._push(TokenDelta("r", 0, [5]))
    stream._push(TokenDelta("r", 2, [7]))
    last = list(stream._items)[-1]
    assert last.error is not None and last.error.type == "stream_gap" and stream.closed
