"""Coalescing publisher for token deltas (and the task messages a prefill worker hands on).

Everything published or pushed during one turn of the engine loop goes out in ONE pipelined round
trip, from ONE flusher task, in the order it was given, so deltas of a request keep their order
(seq) on the wire and a prefill worker's first token and its decode task leave together. A batch that
Redis refuses is dropped (the frontends see a stalled or gapped stream and end it) and the flusher
pauses before the next one, longer while Redis stays away.
"""

from __future__ import annotations

import logging

import redis.asyncio as aioredis

from core.keys import Keys
from core.loops import BackgroundLoop, Backoff

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
            for is_push, key, data in batch:
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
