"""Celery and kombu: Sluice's worker consumer (workers/consumer.py) overrides
``Consumer.on_send_event_buffered``, the hook Celery's ``Events`` bootstep gives the event
dispatcher, to flush buffered task events at most every ``EVENT_FLUSH_S`` through the consumer hub's
``call_soon``/``call_later`` and Celery's private ``Consumer._flush_events``. If Celery stopped
calling the hook, events would go back to one flush per loop turn (a third of the worker's
throughput); if ``_flush_events`` stopped flushing, Flower would see no task events.

Run against a real consumer and hub on an in-memory broker."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
from celery import Celery
from celery.events.dispatcher import EventDispatcher
from celery.worker.consumer import Consumer as CeleryConsumer
from celery.worker.consumer.events import Events
from kombu import Exchange, Queue
from kombu.asynchronous import Hub
from kombu.message import Message

from tests.third_party.guard import drift, installed, parameters
from workers.consumer import EVENT_FLUSH_S, Consumer

CELERY = installed("celery")
KOMBU = installed("kombu")
WHERE = "workers/consumer.py (Consumer)"


@dataclass
class Worker:
    consumer: Consumer
    dispatcher: EventDispatcher
    hub: Hub
    events: Queue  # bound to the event exchange: what Flower would receive

    def published(self) -> list[Message]:
        messages = []
        while (message := self.events.get(no_ack=True)) is not None:
            messages.append(message)
        return messages


@pytest.fixture
def worker() -> Iterator[Worker]:
    app = Celery("sluice-guard", broker="memory://", set_as_current=False)
    hub = Hub()
    consumer = Consumer(
        on_task_request=lambda *_: None, app=app, hub=hub, timer=hub.timer, pool=None,
        hostname=f"guard-{uuid.uuid4().hex[:8]}@test",
        controller=SimpleNamespace(use_eventloop=True),  # the worker controller: only its loop flag is read
    )
    events_step = Events(consumer, task_events=True)
    events_step.start(consumer)
    connection = app.connection_for_read()
    events = Queue(f"guard-{uuid.uuid4().hex}", Exchange("celeryev", type="topic"), routing_key="#", auto_delete=True)
    bound = events(connection.default_channel)
    bound.declare()
    try:
        yield Worker(consumer, consumer.event_dispatcher, hub, bound)
    finally:
        events_step.shutdown(consumer)
        connection.release()
        hub.close()


def test_the_hooks_keep_their_signatures() -> None:
    assert parameters(CeleryConsumer._flush_events) == ["self"], drift(
        CELERY, "Consumer._flush_events changed its signature", WHERE, "how the consumer flushes buffered events")
    assert parameters(CeleryConsumer.on_send_event_buffered) == ["self"], drift(
        CELERY, "Consumer.on_send_event_buffered changed its signature", WHERE, "the event dispatcher's buffer hook")
    assert parameters(Hub.call_soon)[:2] == ["self", "callback"], drift(
        KOMBU, "Hub.call_soon changed its signature", WHERE, "how the consumer schedules a flush")
    assert parameters(Hub.call_later)[:3] == ["self", "delay", "callback"], drift(
        KOMBU, "Hub.call_later changed its signature", WHERE, "how the consumer delays a flush")


def test_the_events_bootstep_buffers_task_events_and_calls_our_hook(worker: Worker) -> None:
    dispatcher = worker.dispatcher
    assert "task" in dispatcher.buffer_group, drift(
        CELERY, "task events are no longer buffered when the consumer has a hub", WHERE,
        "the Events bootstep (celery/worker/consumer/events.py)")
    assert dispatcher.on_send_buffered == worker.consumer.on_send_event_buffered, drift(
        CELERY, "the event dispatcher's on_send_buffered is no longer the consumer's on_send_event_buffered", WHERE,
        "which consumer method the Events bootstep hands the dispatcher")


def test_buffered_events_are_published_together_after_the_flush_delay(worker: Worker) -> None:
    worker.dispatcher.send("task-received", uuid="t1")
    worker.dispatcher.send("task-started", uuid="t1")
    assert worker.published() == [], drift(
        CELERY, "task events were published at once instead of buffered", WHERE, "EventDispatcher.send's buffering")
    start = time.monotonic()
    published: list[Message] = []
    while not published and time.monotonic() - start < 5:
        worker.hub.run_once()
        published = worker.published()
    waited = time.monotonic() - start
    assert len(published) == 1, drift(
        f"{CELERY} / {KOMBU}", f"{len(published)} messages published for two buffered events after running the hub",
        WHERE, "Consumer._flush_events and the hub's call_soon/call_later")
    assert published[0].delivery_info["routing_key"] == "task.multi"
    assert [event["type"] for event in published[0].decode()] == ["task-received", "task-started"]
    assert waited >= EVENT_FLUSH_S * 0.9


def test_flush_events_publishes_the_buffer_now(worker: Worker) -> None:
    worker.dispatcher.send("task-succeeded", uuid="t2")
    CeleryConsumer._flush_events(worker.consumer)
    published = worker.published()
    assert [[event["type"] for event in m.decode()] for m in published] == [["task-succeeded"]], drift(
        CELERY, "Consumer._flush_events no longer publishes the dispatcher's buffered task events", WHERE,
        "what _flush_events does (EventDispatcher.flush)")


def test_a_full_buffer_is_published_at_once(worker: Worker) -> None:
    limit = worker.dispatcher.buffer_limit
    for i in range(limit):
        worker.dispatcher.send("task-received", uuid=f"t{i}")
    published = worker.published()
    assert sum(len(m.decode()) for m in published) == limit, drift(
        CELERY, "a full event buffer is no longer published without waiting for a flush", WHERE,
        "EventDispatcher.send's buffer_limit handling")
