"""The frontend's token streams: ONE pub/sub connection per process, subscribed once.

Every request of this process names the process's token channel as its reply channel; workers
publish msgpack :class:`~core.messages.TokenDelta` there (several in one message: all a worker
had for this process in one engine step) and the reader task hands each one to its request's
:class:`RequestStream`. Subscribing once, at start-up, means no per-request
subscribe round trip and no race between subscribing and the first token.

Failures are delivered, never swallowed: a sequence gap, a lost connection (messages may have
been dropped) or a dead worker ends the affected streams with an error delta.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Iterable

import redis.asyncio as aioredis

from core.errors import STREAM_INTERRUPTED
from core.loops import BackgroundLoop, Backoff
from core.messages import ErrorInfo, TokenDelta, decode_deltas

log = logging.getLogger(__name__)

#: The first pause before reconnecting to the token channel (it grows while Redis stays away).
RECONNECT_DELAY_S = 0.2


class RequestStream:
    """The deltas of one request, in order. ``worker_id`` is known once routed or at the first delta."""

    __slots__ = ("request_id", "worker_id", "handoff_to", "started_at", "_items", "_ready", "_next_seq", "closed")

    def __init__(self, request_id: str, worker_id: str | None, first_seq: int = 0) -> None:
        self.request_id = request_id
        self.worker_id = worker_id
        #: Disaggregated: the decode worker that serves the request once the prefill worker
        #: (``worker_id`` until then) has delivered the first token.
        self.handoff_to: str | None = None
        #: When a worker took the request (its "started" notice; wall clock): None while it is queued.
        self.started_at: float | None = None
        self._items: collections.deque[TokenDelta] = collections.deque()
        self._ready = asyncio.Event()
        self._next_seq = first_seq
        self.closed = False

    def _push(self, delta: TokenDelta) -> None:
        if self.closed:
            return
        if delta.is_start:  # a worker took the request: it is known from now on, the seq unused
            self.started_at = delta.started_at
            if delta.worker_id and self.worker_id is None:
                self.worker_id = delta.worker_id
            self._ready.set()
            return
        if delta.seq < self._next_seq and delta.error is None:
            # A second copy of a delta already delivered (a publish Redis ran twice, as when a
            # connection dropped after the command was sent): the stream has it; drop the copy.
            log.debug("request %s: duplicate delta seq %d dropped", self.request_id, delta.seq)
            return
        if delta.seq != self._next_seq and delta.error is None:
            delta = TokenDelta(self.request_id, self._next_seq, error=ErrorInfo(
                "stream_gap", f"token stream lost messages (expected seq {self._next_seq}, got {delta.seq})"))
        self._next_seq = delta.seq + 1
        if delta.worker_id and self.worker_id is None:
            self.worker_id = delta.worker_id
        if self.handoff_to is not None and delta.seq == 0 and not delta.is_last:
            self.worker_id, self.handoff_to = self.handoff_to, None
        self._items.append(delta)
        if delta.is_last:
            self.closed = True
        self._ready.set()

    def fail(self, kind: str, message: str) -> None:
        self._push(TokenDelta(self.request_id, self._next_seq, error=ErrorInfo(kind, message)))

    async def get_batch(self, timeout: float) -> list[TokenDelta]:
        """Every delta that has arrived (at least one), waiting up to ``timeout`` seconds.

        Raises TimeoutError when nothing arrived in time.
        """
        if not self._items:
            self._ready.clear()
            async with asyncio.timeout(timeout):  # not wait_for: no task per wait, and a cancel is never lost
                await self._ready.wait()
        batch = list(self._items)
        self._items.clear()
        return batch


class StreamHub:
    """Reads the process's token channel; a lost connection fails every stream in flight (their
    messages may be gone) and reconnects after a pause that grows while Redis stays away."""

    def __init__(self, client: aioredis.Redis, channel: str) -> None:
        self._client = client
        self.channel = channel
        self._streams: dict[str, RequestStream] = {}
        self._subscribed = asyncio.Event()
        self._reader = BackgroundLoop("stream-hub", self._session, backoff=Backoff(first_s=RECONNECT_DELAY_S, max_s=1.0),
                                      on_error=self._connection_lost)

    async def start(self) -> None:
        """Subscribe; returns once the subscription is confirmed (TimeoutError after 30 s)."""
        self._reader.start()
        self._reader.wake()
        async with asyncio.timeout(30):
            await self._subscribed.wait()

    async def close(self) -> None:
        await self._reader.stop()

    def open(self, request_id: str, worker_id: str | None, first_seq: int = 0) -> RequestStream:
        """Register a request's stream; ``first_seq``: the ``seq`` its first delta carries (a resumed
        request's worker numbers its deltas on from the tokens it was given)."""
        stream = RequestStream(request_id, worker_id, first_seq)
        self._streams[request_id] = stream
        return stream

    def discard(self, request_id: str) -> None:
        self._streams.pop(request_id, None)

    def in_flight(self) -> int:
        return len(self._streams)

    def active_workers(self) -> set[str]:
        return {s.worker_id for s in self._streams.values() if s.worker_id}

    def streams_of_workers(self, worker_ids: Iterable[str]) -> list[RequestStream]:
        dead = set(worker_ids)
        return [s for s in self._streams.values() if s.worker_id in dead]

    async def _session(self) -> None:
        """One connection's life: subscribe, then hand out deltas until the connection fails."""
        pubsub = self._client.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(self.channel)
            self._subscribed.set()
            self._reader.reset_backoff()
            await self._read(pubsub)
        finally:
            with contextlib.suppress(Exception):
                await pubsub.aclose()

    def fail_all(self, kind: str, message: str) -> None:
        """End every open stream with an error delta of ``kind``."""
        for stream in list(self._streams.values()):
            stream.fail(kind, message)

    @property
    def subscribed(self) -> bool:
        """Whether deltas published now reach this process (False between a lost connection and the
        next subscription: a request started then would lose its first tokens)."""
        return self._subscribed.is_set()

    def _connection_lost(self, exc: Exception) -> None:
        self._subscribed.clear()
        self.fail_all(STREAM_INTERRUPTED, "the token stream was interrupted (Redis connection lost)")

    async def _read(self, pubsub: aioredis.client.PubSub) -> None:
        streams = self._streams
        while True:
            message = await pubsub.get_message(timeout=None)
            if message is None or message["type"] != "message":
                continue
            try:
                deltas = decode_deltas(message["data"])
            except Exception:  # noqa: BLE001 - a malformed message must not kill the reader
                log.exception("undecodable token delta")
                continue
            for delta in deltas:  # a worker's engine step: every delta it had for this process
                stream = streams.get(delta.request_id)
                if stream is not None:
                    stream._push(delta)
