"""Hermes / Qwen tool calls: ``<tool_call>{"name": "f", "arguments": {...}}</tool_call>`` blocks,
as many as the model writes, with text before, between and after them.

Also accepted, because models trained on neighbouring formats write them: a JSON list of calls in
one block (SmolLM2), ``"parameters"`` for ``"arguments"``, and a final block left unclosed because
generation stopped before ``</tool_call>``. A block whose body is not a call (or a list of calls) is
content, markers included: the user sees the model's text rather than an error.

Streaming holds back only a possible partial ``<tool_call>``; once a block opens it is buffered to
its close (or the end of output) and then decoded whole, so each call comes out as one delta.
"""

from __future__ import annotations

from typing import ClassVar

from app.output.parsing.base import (
    ContentDelta,
    HeldText,
    ParsedOutput,
    ParsedToolCall,
    StreamEvent,
    call_from_object,
    emit_calls,
    load_json,
    parse_whole,
)
from app.output.parsing.scan import partial_marker_len

OPEN = "<tool_call>"
CLOSE = "</tool_call>"


def decode_block(body: str) -> list[ParsedToolCall] | None:
    """The calls in one block's body (an object, or a non-empty list of objects), or None when any
    part of it is not a call."""
    obj = load_json(body.strip())
    objects = obj if isinstance(obj, list) else [obj]
    calls = [call_from_object(o) for o in objects]
    if not calls or any(c is None for c in calls):
        return None
    return [c for c in calls if c is not None]


class HermesStreamer(HeldText[StreamEvent]):
    """One output's state: the text not yet told, whether it is inside a block, calls so far."""

    __slots__ = ("_inside", "_close_from", "_calls")

    def __init__(self) -> None:
        super().__init__()
        self._inside = False
        self._close_from = len(OPEN)
        self._calls = 0

    def _drain(self, final: bool) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        while self._held:
            held = self._held
            if not self._inside:
                at = held.find(OPEN)
                if at < 0:
                    at = len(held) - (0 if final else partial_marker_len(held, OPEN))
                    self._content(events, held[:at])
                    self._held = held[at:]
                    return events
                self._content(events, held[:at])
                self._held, self._inside, self._close_from = held[at:], True, len(OPEN)
                continue
            close = held.find(CLOSE, self._close_from)
            if close < 0:
                self._close_from = max(len(OPEN), len(held) - len(CLOSE) + 1)
                if final:
                    self._block(events, held[len(OPEN):], held)
                    self._held = ""
                return events
            stop = close + len(CLOSE)
            self._block(events, held[len(OPEN):close], held[:stop])
            self._held, self._inside = held[stop:], False
        return events

    @staticmethod
    def _content(events: list[StreamEvent], text: str) -> None:
        if text:
            events.append(ContentDelta(text))

    def _block(self, events: list[StreamEvent], body: str, raw: str) -> None:
        calls = decode_block(body)
        if calls is None:
            events.append(ContentDelta(raw))
            return
        events.extend(emit_calls(calls, self._calls))
        self._calls += len(calls)


class HermesParser:
    name: ClassVar[str] = "hermes"

    def parse(self, text: str) -> ParsedOutput:
        return parse_whole(self.streamer(), text)

    def streamer(self) -> HermesStreamer:
        return HermesStreamer()
