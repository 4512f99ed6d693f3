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
