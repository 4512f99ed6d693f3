"""Celery's worker consumer, with task events flushed in batches (``worker_consumer`` in
workers/celery_app.py).

Celery buffers task events (``task-received``, ``task-started``, ``task-succeeded``, ...) and its
consumer flushes the buffer after every turn of its loop: one synchronous ``PUBLISH`` round trip on
the consumer thread per flush, which at a few hundred requests per second is most of what that thread
does, and which keeps it from taking the next task message. This consumer flushes at most every
:data:`EVENT_FLUSH_S`: the same events, in the same order, a few milliseconds later (Flower and
``celery events`` see them ``EVENT_FLUSH_S`` late at worst), and a full buffer (Celery's
``buffer_limit``) still flushes at once.
"""

from __future__ import annotations

from celery.worker.consumer import Consumer as CeleryConsumer

#: The longest a buffered task event waits before it is published.
EVENT_FLUSH_S = 0.02


class Consumer(CeleryConsumer):
    _event_flush_scheduled = False

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
