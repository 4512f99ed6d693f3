"""Ships usage records from the frontend to the bookkeeper, off the token hot path.

:meth:`UsageShipper.add` only appends to an in-memory buffer. A background task wakes every
``interval_s`` (or as soon as a full batch is waiting) and pushes each batch of up to ``batch_max``
records as ONE Celery task message (``RECORD_USAGE_TASK``) onto the namespace's bookkeeping queue
(its list under the broker prefix, core.keys) with one ``LPUSH``; the bookkeeper (workers.bookkeeping)
writes the rows. The database is never touched here, so a database outage does not slow or lose
anything on this side. After a failed push the task
waits ``interval_s``, then longer while Redis stays away, before it tries again.

Invariants: records leave in the order they were added; a batch whose push fails goes back to the
front of the buffer and is pushed again later. The buffer is bounded (``buffer_max``): if Redis is
unreachable for that long, the oldest records are dropped and counted in ``dropped``, and a warning
says so. ``close()`` pushes what is left.
"""

from __future__ import annotations

import logging
from collections import deque

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from core import loops
from core.accounting import UsageRecord, usage_batch_to_builtins
from core.keys import Keys
from core.wire import RECORD_USAGE_TASK, task_message

log = logging.getLogger(__name__)


class UsageShipper:
    def __init__(self, client: aioredis.Redis, keys: Keys, *, batch_max: int, interval_s: float,
                 buffer_max: int) -> None:
        self.client = client
        self.queue = keys.bookkeeping_queue
        self._list = keys.broker_queue_list(self.queue)
        self.batch_max = batch_max
        self.interval_s = interval_s
        self.buffer_max = buffer_max
        self.dropped = 0
        self.shipped = 0
        self._buffer: deque[UsageRecord] = deque()
        # A push in progress at close() is let finish, so that a batch is never both shipped and kept.
        self._pusher = loops.BackgroundLoop("usage-shipper", self.flush, interval_s=interval_s,
                                            backoff=loops.Backoff(first_s=interval_s), finish_step_on_stop=True)

    @property
    def pending(self) -> int:
        return len(self._buffer)

    def add(self, record: UsageRecord) -> None:
        if len(self._buffer) >= self.buffer_max:
            self._buffer.popleft()
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning("usage buffer full (%d records): %d oldest records dropped so far",
                            self.buffer_max, self.dropped)
        self._buffer.append(record)
        if len(self._buffer) >= self.batch_max:
            self._pusher.wake()

    async def flush(self) -> None:
        """Push every buffered record now, batch by batch; raises the Redis error that stopped it."""
        while self._buffer:
            batch = [self._buffer.popleft() for _ in range(min(self.batch_max, len(self._buffer)))]
            message = task_message(RECORD_USAGE_TASK, [usage_batch_to_builtins(batch)], self.queue,
                                   argsrepr=f"[<{len(batch)} usage records>]")
            try:
                await self.client.lpush(self._list, message)
            except BaseException:
                self._buffer.extendleft(reversed(batch))
                raise
            self.shipped += len(batch)

    async def start(self) -> None:
        self._pusher.start()

    async def close(self) -> None:
        await self._pusher.stop()
        try:
            await self.flush()
        except RedisError as exc:
            log.error("lost %d usage records at shutdown: Redis unreachable: %s", self.pending, exc)
