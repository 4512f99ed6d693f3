"""The receiving end of vLLM's ZMQ KV event publisher, bound on loopback.

vLLM's publisher binds when its endpoint has a wildcard (``tcp://*:5557``, every interface) and
connects otherwise. Sluice always gives it ``tcp://127.0.0.1:<port>`` of a SUB socket bound here,
so the events never leave the host and each engine has its own port (picked by the OS).

Frames are ``(topic, seq, payload)``: ``seq`` is an 8-byte big-endian batch counter from 0, used
to notice lost batches (the publisher drops past its high-water mark).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import zmq
import zmq.asyncio

log = logging.getLogger(__name__)

TOPIC = "kv"
_HOST = "tcp://127.0.0.1"
_RCVHWM = 100_000


class KvEventSubscriber:
    """A SUB socket on a free loopback port; create it on the loop that will read it."""

    def __init__(self, topic: str = TOPIC) -> None:
        self.topic = topic
        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.RCVHWM, _RCVHWM)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
        port = self._sock.bind_to_random_port(_HOST)
        self.endpoint = f"{_HOST}:{port}"
        self._next_seq = 0

    async def payloads(self) -> AsyncIterator[bytes]:
        """Each batch's payload, in order, until :meth:`close`."""
        while True:
            try:
                frames = await self._sock.recv_multipart()
            except (zmq.ContextTerminated, zmq.ZMQError):
                return
            if len(frames) != 3:
                log.warning("ignoring a KV event message of %d frames", len(frames))
                continue
            _, seq_bytes, payload = frames
            seq = int.from_bytes(seq_bytes, "big", signed=True)
            if seq != self._next_seq:
                log.warning("KV events %d..%d were lost; the router may hold stale blocks", self._next_seq, seq - 1)
            self._next_seq = seq + 1
            yield payload

    def close(self) -> None:
        self._sock.close(linger=0)
        self._ctx.term()
