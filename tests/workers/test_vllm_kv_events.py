"""workers.engines.vllm.kv_events: vLLM KV events -> Sluice block hashes, and what is lost on the way
(no vLLM needed).

Where vLLM is installed, its own event classes encode a batch that the wire structs decode.
"""

from __future__ import annotations

import importlib.util

import msgspec
import pytest

from core.messages import AllBlocksCleared, BlockRemoved, BlockStored
from router.hashing import block_hashes, root_hash
from tests.support.kv_events import KvEventLog
from workers.engines.base import KvTrackLost
from workers.engines.vllm.kv_events import (
    KvEventFeed,
    KvEventTranslator,
    UndecodableBatch,
    WireAllBlocksCleared,
    WireBlockRemoved,
    WireBlockStored,
    decode_batch,
    sequence_gap,
)

B = 4
MODEL = "m"
PROMPT = list(range(100, 100 + 4 * B + 2))  # four full blocks and a partial one
SLUICE = block_hashes(PROMPT, B, root_hash(MODEL))


def stored(vllm_hashes: list[int], tokens: list[int], parent: int | None = None, **kw: object) -> WireBlockStored:
    return WireBlockStored(block_hashes=vllm_hashes, parent_block_hash=parent, token_ids=tokens, block_size=B, **kw)  # type: ignore[arg-type]


def test_root_chain_is_hashed_like_the_router_does() -> None:
    tr = KvEventTranslator(MODEL, B)
    out = tr.apply([stored([11, 12], PROMPT[: 2 * B])])
    assert out == [BlockStored(block_hashes=SLUICE[:2], parent_hash=None)]
    assert set(tr.cached_hashes()) == set(SLUICE[:2])


def test_continued_chain_uses_the_parents_sluice_hash() -> None:
    tr = KvEventTranslator(MODEL, B)
    tr.apply([stored([11, 12], PROMPT[: 2 * B])])
    out = tr.apply([stored([13, 14], PROMPT[2 * B : 4 * B], parent=12)])
    assert out == [BlockStored(block_hashes=SLUICE[2:4], parent_hash=SLUICE[1])]
    assert set(tr.cached_hashes()) == set(SLUICE)


def test_lora_changes_the_root() -> None:
    tr = KvEventTranslator(MODEL, B)
    (event,) = tr.apply([stored([11], PROMPT[:B], lora_name="adapter")])
    assert isinstance(event, BlockStored)
    assert event.block_hashes == block_hashes(PROMPT[:B], B, root_hash(MODEL, "adapter"))


def test_removed_blocks_are_translated_through_the_map() -> None:
    tr = KvEventTranslator(MODEL, B)
    tr.apply([stored([11, 12, 13], PROMPT[: 3 * B])])
    out = tr.apply([WireBlockRemoved(block_hashes=[13, 99]), WireBlockRemoved(block_hashes=[12])])
    assert out == [BlockRemoved(block_hashes=[SLUICE[2]]), BlockRemoved(block_hashes=[SLUICE[1]])]
    assert tr.cached_hashes() == [SLUICE[0]]
    assert tr.apply([WireBlockRemoved(block_hashes=[13])]) == []  # already gone


def test_a_block_cached_twice_is_removed_with_its_last_copy() -> None:
    tr = KvEventTranslator(MODEL, B)
    tr.apply([stored([11], PROMPT[:B]), stored([11], PROMPT[:B])])
    assert tr.apply([WireBlockRemoved(block_hashes=[11])]) == []
    assert tr.cached_hashes() == [SLUICE[0]]
    assert tr.apply([WireBlockRemoved(block_hashes=[11])]) == [BlockRemoved(block_hashes=[SLUICE[0]])]
    assert tr.cached_hashes() == []


def test_cleared_forgets_everything() -> None:
    tr = KvEventTranslator(MODEL, B)
    tr.apply([stored([11, 12], PROMPT[: 2 * B])])
    assert tr.apply([WireAllBlocksCleared()]) == [AllBlocksCleared()]
    assert tr.cached_hashes() == []
    # The map is gone too: a later child of a forgotten parent cannot be placed.
    assert tr.apply([stored([13], PROMPT[2 * B : 3 * B], parent=12)]) == []


def test_events_that_cannot_be_translated_are_skipped() -> None:
    tr = KvEventTranslator(MODEL, B)
    assert tr.apply([stored([11], PROMPT[:B], parent=7)]) == []  # unknown parent
    assert tr.apply([stored([11], PROMPT[:B], medium="CPU")]) == []  # an offload tier
    odd = WireBlockStored(block_hashes=[11], token_ids=PROMPT[:B], block_size=2 * B)
    assert tr.apply([odd]) == []  # another block size
    assert tr.cached_hashes() == []


def test_bytes_hashes_work_like_ints() -> None:
    tr = KvEventTranslator(MODEL, B)
    tr.apply([stored([b"\x01" * 32], PROMPT[:B])])  # type: ignore[list-item]
    out = tr.apply([stored([b"\x02" * 32], PROMPT[B : 2 * B], parent=b"\x01" * 32)])  # type: ignore[list-item,arg-type]
    assert out == [BlockStored(block_hashes=[SLUICE[1]], parent_hash=SLUICE[0])]


def test_decode_batch_reads_the_published_wire_format() -> None:
    # vLLM's EventBatch is array-like (ts, events, dp rank); events are maps tagged by "type".
    payload = msgspec.msgpack.encode(
        [
            1.5,
            [
                {
                    "type": "BlockStored",
                    "block_hashes": [11],
                    "parent_block_hash": None,
                    "token_ids": PROMPT[:B],
                    "block_size": B,
                    "lora_id": None,
                    "medium": "GPU",
                    "lora_name": None,
                    "group_idx": 0,
                    "some_future_field": [1, 2],
                },
                {"type": "SomethingNew", "x": 1},
                {"type": "BlockRemoved", "block_hashes": [11], "medium": "GPU"},
                {"type": "AllBlocksCleared"},
            ],
            0,
        ]
    )
    events = decode_batch(payload)
    assert [type(e) for e in events] == [WireBlockStored, WireBlockRemoved, WireAllBlocksCleared]
    assert events[0] == WireBlockStored(block_hashes=[11], token_ids=PROMPT[:B], block_size=B, medium="GPU")


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_decode_batch_reads_vllms_own_encoding() -> None:
    from vllm.distributed import kv_events as v

    batch = v.KVEventBatch(
        ts=1.0,
        events=[
            v.BlockStored(
                block_hashes=[11, 12],
                parent_block_hash=None,
                token_ids=PROMPT[: 2 * B],
                block_size=B,
                lora_id=None,
                medium=v.MEDIUM_GPU,
                lora_name=None,
            ),
            v.BlockRemoved(block_hashes=[12], medium=v.MEDIUM_GPU),
            v.AllBlocksCleared(),
        ],
    )
    tr = KvEventTranslator(MODEL, B)
    out = tr.apply(decode_batch(msgspec.msgpack.Encoder().encode(batch)))
    assert out == [
        BlockStored(block_hashes=SLUICE[:2]),
        BlockRemoved(block_hashes=[SLUICE[1]]),
        AllBlocksCleared(),
    ]


# ---- lost and unreadable reports ---------------------------------------------------------------------


def test_sequence_gap_names_what_was_lost() -> None:
    assert sequence_gap(0, 0) is None and sequence_gap(41, 41) is None
    assert sequence_gap(5, 6) == "batch 5 was lost"
    assert sequence_gap(5, 9) == "batches 5..8 were lost"
    assert sequence_gap(0, 3) == "batches 0..2 were lost"  # the first batches never came
    assert sequence_gap(9, 0) == "the batch numbering went back from 9 to 0"


def _event(kind: str, **fields: object) -> dict:
    return {"type": kind, **fields}


def _payload(*events: dict) -> bytes:
    return msgspec.msgpack.encode([1.0, list(events), 0])


def test_an_unreadable_batch_or_known_event_is_undecodable_and_an_unknown_kind_is_skipped() -> None:
    removed = _event("BlockRemoved", block_hashes=[11], medium="GPU")
    assert decode_batch(_payload(_event("SomethingNew", x=1), removed)) == [WireBlockRemoved([11], "GPU")]
    for payload in (b"\xc1 not msgpack", msgspec.msgpack.encode({"not": "a batch"}),
                    _payload(removed, _event("BlockStored", block_hashes="not a list")),
                    _payload(removed, {"no": "type"}), _payload(removed, 7)):
        with pytest.raises(UndecodableBatch):
            decode_batch(payload)


def _frames(seq: int, payload: bytes) -> list[bytes]:
    return [b"kv", seq.to_bytes(8, "big"), payload]


def test_the_feed_forgets_what_it_can_no_longer_vouch_for() -> None:
    """A gap (or an unreadable message) makes the translator forget every block and the sink get a
    KvTrackLost, in order; the batch that revealed the gap is applied after it."""
    sink, tr = KvEventLog(), KvEventTranslator(MODEL, B)
    feed = KvEventFeed(tr, sink)
    store = _event("BlockStored", block_hashes=[11, 12], parent_block_hash=None, token_ids=PROMPT[: 2 * B],
                   block_size=B, medium="GPU")
    feed.receive(_frames(0, _payload(store)))
    assert sink.events == [BlockStored(SLUICE[:2])] and feed.next_seq == 1

    child = _event("BlockStored", block_hashes=[13], parent_block_hash=12, token_ids=PROMPT[2 * B : 3 * B],
                   block_size=B, medium="GPU")
    root = _event("BlockStored", block_hashes=[21], parent_block_hash=None, token_ids=PROMPT[:B], block_size=B)
    feed.receive(_frames(3, _payload(child, root)))  # batches 1 and 2 never came
    assert sink.events[1:] == [KvTrackLost("gap", "batches 1..2 were lost"), BlockStored(SLUICE[:1])]
    assert tr.cached_hashes() == [SLUICE[0]]  # the child of a forgotten block cannot be placed

    feed.receive(_frames(4, b"\xc1"))
    feed.receive([b"kv", b"\x00"])
    lost = sink.events[3:]
    assert [(e.reason, type(e)) for e in lost] == [("undecodable", KvTrackLost)] * 2  # type: ignore[union-attr]
    assert tr.cached_hashes() == [] and feed.next_seq == 5


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
async def test_the_feed_reads_vllms_own_publisher_over_zmq() -> None:
    """vLLM's ZMQ publisher, connecting to the worker's subscriber as the engine configures it: its
    frames and numbering are what the feed expects (no loss reported), and its batches translate."""
    import asyncio

    from vllm.distributed import kv_events as v

    from workers.engines.vllm.kv_subscriber import KvEventSubscriber

    subscriber = KvEventSubscriber()
    publisher = v.ZmqEventPublisher(0, endpoint=subscriber.endpoint, topic="kv")
    sink, tr = KvEventLog(), KvEventTranslator(MODEL, B)
    feed = KvEventFeed(tr, sink)
    batches = [v.BlockStored(block_hashes=[11 + i], parent_block_hash=10 + i if i else None,
                             token_ids=PROMPT[i * B : (i + 1) * B], block_size=B, lora_id=None, medium=v.MEDIUM_GPU,
                             lora_name=None) for i in range(3)]
    messages = subscriber.messages()
    try:
        # A PUB socket drops what it sends before the connection is up: send empty batches until one
        # arrives (any that follow it are in sequence and carry nothing).
        async def connected() -> list[bytes]:
            # One pending read for all the tries: cancelling a read (wait_for on a timeout) would close
            # the subscriber's generator.
            pending = asyncio.ensure_future(messages.__anext__())
            while True:
                publisher.publish(v.KVEventBatch(ts=1.0, events=[]))
                done, _ = await asyncio.wait({pending}, timeout=0.5)
                if done:
                    return pending.result()
        frames = await connected()
        feed.next_seq = int.from_bytes(frames[1], "big")
        feed.receive(frames)
        for event in batches:
            publisher.publish(v.KVEventBatch(ts=1.0, events=[event]))
        while len(sink.events) < 3:
            feed.receive(await asyncio.wait_for(messages.__anext__(), 10))
        assert sink.events == [BlockStored(SLUICE[:1]), BlockStored(SLUICE[1:2], SLUICE[0]),
                               BlockStored(SLUICE[2:3], SLUICE[1])]
    finally:
        publisher.shutdown()
        subscriber.close()


def test_tier_events_of_sluices_connector_pass_through_with_their_tier() -> None:
    """workers.engines.vllm.kvbm_connector publishes tier changes with ``medium`` ``sluice:<tier>`` and
    Sluice hashes: they keep their hashes, gain their tier, and leave the device cache's record alone."""
    tr = KvEventTranslator(MODEL, B)
    out = tr.apply([
        WireBlockStored(block_hashes=SLUICE[:2], block_size=B, medium="sluice:host"),
        WireBlockStored(block_hashes=SLUICE[:1], block_size=B, medium="sluice:disk"),
        WireBlockRemoved(block_hashes=SLUICE[1:2], medium="sluice:host"),
        WireBlockStored(block_hashes=[99], block_size=B, medium="CPU"),  # vLLM's own offloading: not Sluice's
    ])
    assert out == [
        BlockStored(block_hashes=SLUICE[:2], tier="host"),
        BlockStored(block_hashes=SLUICE[:1], tier="disk"),
        BlockRemoved(block_hashes=SLUICE[1:2], tier="host"),
    ]
    assert tr.cached_hashes() == []
