"""Token streaming over real Redis pub/sub: one shared subscription, ordered coalesced publishing,
gap detection, reconnection failure delivery."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from app.requests.streams import StreamHub
from core.errors import STREAM_INTERRUPTED
from core.keys import Keys
from core.messages import TokenDelta, Usage, decode_deltas, encode_delta
from workers.publisher import DeltaPublisher


@pytest.fixture
async def clients(redis_server):  # noqa: ANN001, ANN201
    a, b = aioredis.from_url(redis_server.url), aioredis.from_url(redis_server.url)
    yield a, b
    await a.aclose()
    await b.aclose()


async def drain(stream, n_last: int = 1) -> list[TokenDelta]:  # noqa: ANN001
    out: list[TokenDelta] = []
    while not out or not out[-1].is_last:
        out.extend(await stream.get_batch(30))
    return out


async def test_many_requests_share_one_subscription_in_order(clients, namespace) -> None:  # noqa: ANN001
    frontend, worker = clients
    hub = StreamHub(frontend, f"sluice:{namespace}:tok:f1")
    await hub.start()
    pubsub_clients_before = len(await frontend.client_list(_type="pubsub"))
    pub = DeltaPublisher(worker, Keys(namespace))
    pub.start()
    streams = {f"r{i}": hub.open(f"r{i}", "w") for i in range(20)}
    for seq in range(10):
        for rid in streams:
            last = seq == 9
            pub.publish(hub.channel, encode_delta(TokenDelta(
                rid, seq, [seq], finish_reason="length" if last else None,
                usage=Usage(3, 10) if last else None)))
        await asyncio.sleep(0)
    for stream in streams.values():
        deltas = await drain(stream)
        assert [d.seq for d in deltas] == list(range(10))
        assert [t for d in deltas for t in d.token_ids] == list(range(10))
        assert deltas[-1].usage == Usage(3, 10)
    # one subscription, made at start-up, serves all 20 requests: no connection per request
    assert await frontend.pubsub_numsub(hub.channel) == [(hub.channel.encode(), 1)]
    assert len(await frontend.client_list(_type="pubsub")) == pubsub_clients_before
    await pub.close()
    await hub.close()


async def test_sequence_gap_becomes_an_error(clients, namespace) -> None:  # noqa: ANN001
    frontend, worker = clients
    hub = StreamHub(frontend, f"sluice:{namespace}:tok:f2")
    await hub.start()
    stream = hub.open("r", "w")
    await worker.publish(hub.channel, encode_delta(TokenDelta("r", 0, [1])))
    await worker.publish(hub.channel, encode_delta(TokenDelta("r", 2, [3])))
    deltas = await drain(stream)
    assert deltas[-1].error is not None and deltas[-1].error.type == "stream_gap"
    await hub.close()


async def test_messages_for_unknown_requests_are_ignored(clients, namespace) -> None:  # noqa: ANN001
    frontend, worker = clients
    hub = StreamHub(frontend, f"sluice:{namespace}:tok:f3")
    await hub.start()
    stream = hub.open("mine", None)
    await worker.publish(hub.channel, encode_delta(TokenDelta("other", 0, [9], finish_reason="stop")))
    await worker.publish(hub.channel, b"not msgpack at all \xff")
    await worker.publish(hub.channel, encode_delta(TokenDelta("mine", 0, [1], finish_reason="stop", worker_id="w9")))
    deltas = await drain(stream)
    assert deltas[0].token_ids == [1] and stream.worker_id == "w9"
    await hub.close()


async def test_stall_raises_timeout(clients, namespace) -> None:  # noqa: ANN001
    frontend, _ = clients
    hub = StreamHub(frontend, f"sluice:{namespace}:tok:f4")
    await hub.start()
    stream = hub.open("r", "w")
    with pytest.raises(TimeoutError):
        await stream.get_batch(0.05)
    await hub.close()


async def test_close_publishes_what_is_pending_before_the_flusher_ran(clients, namespace) -> None:  # noqa: ANN001
    frontend, worker = clients
    hub = StreamHub(frontend, f"sluice:{namespace}:tok:f5")
    await hub.start()
    stream = hub.open("r", "w")
    pub = DeltaPublisher(worker, Keys(namespace))
    pub.start()
    pub.publish(hub.channel, encode_delta(TokenDelta("r", 0, [1])))
    pub.publish(hub.channel, encode_delta(TokenDelta("r", 1, [2], finish_reason="stop")))
    async with asyncio.timeout(5):
        await pub.close()  # in this task, so before the flusher had its first turn
    deltas = await drain(stream)
    assert [d.seq for d in deltas] == [0, 1] and deltas[-1].finish_reason == "stop"
    await hub.close()


async def test_a_lost_connection_fails_the_streams_in_flight_and_the_hub_resubscribes(
        redis_server, namespace) -> None:  # noqa: ANN001
    name = f"hub-{namespace}"
    frontend = aioredis.from_url(redis_server.url, client_name=name)
    worker = aioredis.from_url(redis_server.url)
    hub = StreamHub(frontend, f"sluice:{namespace}:tok:f6")
    await hub.start()
    stream = hub.open("r", "w")
    await worker.publish(hub.channel, encode_delta(TokenDelta("r", 0, [1])))
    assert [d.seq for d in await stream.get_batch(5)] == [0]
    for client in await worker.client_list(_type="pubsub"):
        if client["name"] == name:
            await worker.client_kill_filter(_id=client["id"])
    deltas = await drain(stream)
    assert deltas[-1].error is not None and deltas[-1].error.type == STREAM_INTERRUPTED
    # Back after the first pause (0.2 s); a busy machine may take longer. The hub's own flag, not the
    # channel's subscriber count alone: redis-py's pub/sub reconnects (and subscribes again) once before
    # it gives up, so for a moment the count can be the old connection's, which the hub is closing.
    async with asyncio.timeout(60):
        while not hub.subscribed or await worker.pubsub_numsub(hub.channel) != [(hub.channel.encode(), 1)]:
            await asyncio.sleep(0.05)
    later = hub.open("r2", "w")
    await worker.publish(hub.channel, encode_delta(TokenDelta("r2", 0, [7], finish_reason="stop")))
    assert [t for d in await drain(later) for t in d.token_ids] == [7]
    await hub.close()
    await frontend.aclose()
    await worker.aclose()


async def test_an_engine_steps_deltas_for_one_frontend_go_as_one_message(clients, namespace) -> None:  # noqa: ANN001
    """Twenty requests' tokens of one engine-loop turn: one PUBLISH to their frontend's channel (and
    one pub/sub message for it to read), the requests' streams as if each had been sent alone."""
    frontend, worker = clients
    hub = StreamHub(frontend, f"sluice:{namespace}:tok:f7")
    await hub.start()
    raw = frontend.pubsub(ignore_subscribe_messages=True)
    await raw.subscribe(hub.channel)
    pub = DeltaPublisher(worker, Keys(namespace))
    pub.start()
    streams = {f"r{i}": hub.open(f"r{i}", "w") for i in range(20)}
    for rid in streams:  # one turn: nothing awaited in between
        pub.publish(hub.channel, encode_delta(TokenDelta(rid, 0, [7], finish_reason="stop")))
    for stream in streams.values():
        assert [(d.seq, d.token_ids) for d in await drain(stream)] == [(0, [7])]
    messages = []
    async with asyncio.timeout(5):
        while len(messages) < 1:
            if (message := await raw.get_message(timeout=1)) is not None:
                messages.append(message)
    assert await raw.get_message(timeout=0.2) is None  # and no other
    assert len(decode_deltas(messages[0]["data"])) == 20
    await raw.aclose()
    await pub.close()
    await hub.close()
