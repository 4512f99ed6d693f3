"""Llama 3.1 / 3.2 JSON tool calls: output that, after whitespace and an optional
``<|python_tag|>``, is one or more ``{"name": ..., "parameters": {...}}`` objects (``"arguments"``
is accepted too) separated by ``;`` or whitespace.

The decision is made on the first significant character: an output that does not start with ``{``
is all content, streamed as it comes. Otherwise each object is buffered until its braces close and
then decoded; it is a call when it is one. An object that is not a call, or one left unclosed at the
end, ends the calls: from there on everything is content (all of the output, tag included, when no
call came before it), so the user sees the model's text.
"""

from __future__ import annotations

from enum import Enum, auto
from typing import ClassVar

from app.output.parsing.base import (
    ContentDelta,
    HeldText,
    ParsedOutput,
    StreamEvent,
    call_from_object,
    emit_calls,
    load_json,
    parse_whole,
)
from app.output.parsing.scan import BracketScanner, skip_lead

PYTHON_TAG = "<|python_tag|>"
SEPARATORS = " \t\r\n;"


class _State(Enum):
    LEAD = auto()
    OBJECT = auto()
    BETWEEN = auto()
    CONTENT = auto()


class Llama3JsonStreamer(HeldText[StreamEvent]):
    """One output's state. ``_held`` is text not yet told; while in ``OBJECT`` the object starts at
    ``_scanner``'s start (after the lead, which stays held until the first call is told)."""

    __slots__ = ("_state", "_scanner", "_object_at", "_calls")

    def __init__(self) -> None:
        super().__init__()
        self._state = _State.LEAD
        self._scanner = BracketScanner('"')
        self._object_at = 0
        self._calls = 0

    def _open_object(self, at: int) -> None:
        self._state, self._object_at, self._scanner = _State.OBJECT, at, BracketScanner('"', at)

    def _drain(self, final: bool) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        while self._held:
            held = self._held
            if self._state is _State.LEAD:
                at = skip_lead(held, PYTHON_TAG)
                if at is None and not final:
                    return events
                if at is None or held[at] != "{":
                    self._state = _State.CONTENT
                    continue
                self._open_object(at)
            elif self._state is _State.OBJECT:
                end = self._scanner.end(held)
                if end is None and not final:
                    return events
                call = None if end is None else call_from_object(load_json(held[self._object_at:end]))
                if end is None or call is None:
                    self._state = _State.CONTENT
                    continue
                events.extend(emit_calls([call], self._calls))
                self._calls += 1
                self._held, self._state = held[end:], _State.BETWEEN
            elif self._state is _State.BETWEEN:
                rest = held.lstrip(SEPARATORS)
                if not rest:
                    if final:
                        self._held = ""
                    return events
                self._held = rest
                if rest[0] == "{":
                    self._open_object(0)
                else:
                    self._state = _State.CONTENT
            else:
                events.append(ContentDelta(held))
                self._held = ""
        return events


class Llama3JsonParser:
    name: ClassVar[str] = "llama3_json"

    def parse(self, text: str) -> ParsedOutput:
        return parse_whole(self.streamer(), text)

    def streamer(self) -> Llama3JsonStreamer:
        return Llama3JsonStreamer()
