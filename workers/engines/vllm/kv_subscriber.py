"""The receiving end of vLLM's ZMQ KV event publisher, bound on loopback.

vLLM's publisher binds when its endpoint has a wildcard (``tcp://*:5557``, every interface) and
connects otherwise. Sluice always gives it ``tcp://127.0.0.1:<port>`` of a SUB socket bound here,
so the events never leave the host and each engine has its own port (picked by the OS).

Each message is the frames ``(topic, seq, payload)``: ``seq`` is an 8-byte big-endian batch counter
from 0; the publisher drops batches past its high-water mark. The frames are handed on as they come:
:class:`workers.engines.vllm.kv_events.KvEventFeed` checks the numbering and decodes them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import zmq
import zmq.asyncio

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

    async def messages(self) -> AsyncIterator[list[bytes]]:
        """Each message's frames, in order, until :meth:`close`."""
        while True:
            try:
                yield await self._sock.recv_multipart()
            except (zmq.ContextTerminated, zmq.ZMQError):
                return

    def close(self) -> None:
        self._sock.close(linger=0)
        self._ctx.term()
