"""Coalescing publisher for token deltas (and the task messages a prefill worker hands on).

Everything published or pushed during one turn of the engine loop goes out in ONE pipelined round
trip, from ONE flusher task, so deltas of a request keep their order (seq) on the wire and a prefill
worker's first token and its decode task leave together. The deltas bound for one channel (one
frontend process: every request of it) go as ONE message (core.messages.join_deltas), at the place
of the first of them: an engine step's tokens for a frontend cost Redis one ``PUBLISH`` and the
frontend one pub/sub message, whatever the batch size. No delta goes out later than given. A batch that
Redis refuses is dropped (the frontends see a stalled or gapped stream and end it) and the flusher
pauses before the next one, longer while Redis stays away.
"""

from __future__ import annotations

import logging

import redis.asyncio as aioredis

from core.keys import Keys
from core.loops import BackgroundLoop, Backoff
from core.messages import join_deltas

log = logging.getLogger(__name__)

#: The first pause after a failed batch (it grows while Redis stays away).
RETRY_DELAY_S = 0.1


class DeltaPublisher:
    def __init__(self, client: aioredis.Redis, keys: Keys) -> None:
        self._client = client
        self._keys = keys
        self._pending: list[tuple[bool, str, bytes]] = []  # (is a push, channel or list key, data)
        # A batch being sent when the publisher closes is let finish: cutting it could lose the last
        # deltas of a request, or send them twice after close() sends what is left.
        self._flusher = BackgroundLoop("delta-publisher", self._flush, backoff=Backoff(first_s=RETRY_DELAY_S),
                                       finish_step_on_stop=True)

    def start(self) -> None:
        self._flusher.start()

    def publish(self, channel: str, data: bytes) -> None:
        self._pending.append((False, channel, data))
        self._flusher.wake()

    def push(self, queue: str, message: bytes) -> None:
        """``LPUSH`` a task message onto ``queue`` (core.wire; its list under the namespace's broker
        prefix, core.keys), in order with the deltas."""
        self._pending.append((True, self._keys.broker_queue_list(queue), message))
        self._flusher.wake()

    async def _flush(self) -> None:
        batch, self._pending = self._pending, []
        if not batch:
            return
        async with self._client.pipeline(transaction=False) as pipe:
            for is_push, key, data in group_by_channel(batch):
                if is_push:
                    pipe.lpush(key, data)
                else:
                    pipe.publish(key, data)
            await pipe.execute()

    async def close(self) -> None:
        """Flush what is pending, then stop."""
        await self._flusher.stop()
        try:
            await self._flush()
        except Exception:  # noqa: BLE001 - shutting down: the frontends will see the streams end
            log.exception("publishing the last token deltas failed")


def group_by_channel(batch: list[tuple[bool, str, bytes]]) -> list[tuple[bool, str, bytes]]:
    """The batch with each channel's deltas joined into one message at the place of its first delta;
    pushes stay where they are."""
    by_channel: dict[str, list[bytes]] = {}
    order: list[tuple[bool, str, bytes] | str] = []
    for item in batch:
        is_push, key, data = item
        if is_push:
            order.append(item)
            continue
        deltas = by_channel.get(key)
        if deltas is None:
            by_channel[key] = [data]
            order.append(key)
        else:
            deltas.append(data)
    if len(order) == len(batch):  # nothing to join
        return batch
    out: list[tuple[bool, str, bytes]] = []
    for entry in order:
        if isinstance(entry, str):
            deltas = by_channel[entry]
            out.append((False, entry, deltas[0] if len(deltas) == 1 else join_deltas(deltas)))
        else:
            out.append(entry)
    return out
