"""Celery's worker consumer (``worker_consumer`` in workers/celery_app.py), with task events flushed
in batches and a quick reconnect to the broker.

Celery buffers task events (``task-received``, ``task-started``, ``task-succeeded``, ...) and its
consumer flushes the buffer after every turn of its loop: one synchronous ``PUBLISH`` round trip on
the consumer thread per flush, which at a few hundred requests per second is most of what that thread
does, and which keeps it from taking the next task message. This consumer flushes at most every
:data:`EVENT_FLUSH_S`: the same events, in the same order, a few milliseconds later (Flower and
``celery events`` see them ``EVENT_FLUSH_S`` late at worst), and a full buffer (Celery's
``buffer_limit``) still flushes at once.

Reconnect: when the broker connection is lost, Celery's consumer reconnects with kombu's default
pauses (2 s, then 4, 6, ... up to 30 s between tries), so after a Redis restart of a few seconds a
worker took up to 6 s (and after a long one up to 30 s) to take tasks again, although its heartbeat
had already made it routable. This consumer retries every :data:`RECONNECT_PAUSES_S` instead: a
try is a refused TCP connect while Redis is away, cheap even at that pace.
"""

from __future__ import annotations

import functools

from celery.worker.consumer import Consumer as CeleryConsumer
from kombu.connection import Connection

#: Pauses between broker reconnect tries: the first, the growth per try, the longest.
RECONNECT_PAUSES_S = (0.2, 0.2, 1.0)

#: The longest a buffered task event waits before it is published.
EVENT_FLUSH_S = 0.02


class Consumer(CeleryConsumer):
    _event_flush_scheduled = False

    def connection_for_read(self, heartbeat: float | None = None) -> Connection:
        """The broker connection, whose ``ensure_connection`` (Celery's reconnect loop) pauses
        :data:`RECONNECT_PAUSES_S` between tries."""
        conn = self.app.connection_for_read(heartbeat=heartbeat)
        start, step, longest = RECONNECT_PAUSES_S
        conn.ensure_connection = functools.partial(
            conn.ensure_connection, interval_start=start, interval_step=step, interval_max=longest)
        return self.ensure_connected(conn)

    def on_send_event_buffered(self) -> None:
        """An event was buffered (any thread): make sure one flush is scheduled on the consumer's loop."""
        if self.hub and not self._event_flush_scheduled:
            self._event_flush_scheduled = True
            self.hub.call_soon(self._schedule_event_flush)

    def _schedule_event_flush(self) -> None:
        # On the consumer's loop thread, where its timer may be used.
        self.hub.call_later(EVENT_FLUSH_S, self._flush_buffered_events)

    def _flush_buffered_events(self) -> None:
        # Cleared first: an event buffered while this flush publishes schedules the next one.
        self._event_flush_scheduled = False
        self._flush_events()
