"""The types every tool-call format shares, and the one rule that ties streaming to whole text.

Each format is written once, as a streamer (a small state machine fed deltas of output); ``parse``
feeds it the whole text. So the streamed and the whole-text results cannot drift apart by
construction, and the tests only have to show that a streamer's result does not depend on how the
output was split into deltas. Streamers never raise on model text: whatever does not decode as a
call is handed back as content, so the user still sees what the model wrote.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar, Generic, Protocol, TypeVar


@dataclass(frozen=True, slots=True)
class ParsedToolCall:
    name: str
    arguments: str
    """A JSON object text: the compact ``json.dumps`` of the arguments dict."""


@dataclass(frozen=True, slots=True)
class ParsedOutput:
    content: str | None
    """Text outside tool calls, stripped; None when empty."""
    tool_calls: list[ParsedToolCall]


@dataclass(frozen=True, slots=True)
class ContentDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    index: int
    """0-based index of the call in this output."""
    name: str | None
    """Set on the call's first delta only."""
    arguments: str
    """A fragment of the arguments JSON; a call's fragments, concatenated, are its arguments text."""


StreamEvent = ContentDelta | ToolCallDelta


class ToolStreamer(Protocol):
    def feed(self, text: str) -> list[StreamEvent]:
        """``text``: the next delta of output. Returns what can be told now; text that may still turn
        out to be part of a call is held back."""
        ...

    def finish(self) -> list[StreamEvent]:
        """End of output: flushes whatever is held (an unfinished call as content, or as a call when
        what is held already decodes as one)."""
        ...


class ToolParser(Protocol):
    name: ClassVar[str]

    def parse(self, text: str) -> ParsedOutput: ...

    def streamer(self) -> ToolStreamer: ...


Event = TypeVar("Event")


class HeldText(Generic[Event]):
    """A streamer's shared part: text is held until :meth:`_drain` can tell what it is; ``feed``
    adds to it, ``finish`` drains what is left (``final``: no more text will come)."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held = ""

    def feed(self, text: str) -> list[Event]:
        self._held += text
        return self._drain(final=False)

    def finish(self) -> list[Event]:
        return self._drain(final=True)

    def _drain(self, final: bool) -> list[Event]:
        raise NotImplementedError


def dump_arguments(arguments: dict[str, object]) -> str:
    """The arguments text of a call: compact JSON, non-ASCII kept as is (as OpenAI returns it)."""
    return json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))


def call_from_object(obj: object) -> ParsedToolCall | None:
    """A call from ``{"name": ..., "arguments": {...}}`` (``"parameters"`` is accepted for
    ``"arguments"``; neither means no arguments). None unless the name is a non-empty string and the
    arguments a JSON object."""
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    arguments = obj["arguments"] if "arguments" in obj else obj.get("parameters", {})
    if not isinstance(name, str) or not name or not isinstance(arguments, dict):
        return None
    return ParsedToolCall(name=name, arguments=dump_arguments(arguments))


def load_json(text: str) -> object | None:
    """``json.loads`` that answers None for anything it cannot decode (deep nesting included)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def collect(events: Iterable[StreamEvent]) -> ParsedOutput:
    """Folds a stream's events into the whole-text result (content joined then stripped; each call's
    name from its first delta, its arguments the concatenation of its fragments)."""
    content: list[str] = []
    names: dict[int, str] = {}
    arguments: dict[int, list[str]] = {}
    for event in events:
        if isinstance(event, ContentDelta):
            content.append(event.text)
            continue
        if event.name is not None and event.index not in names:
            names[event.index] = event.name
        arguments.setdefault(event.index, []).append(event.arguments)
    calls = [ParsedToolCall(name=names[i], arguments="".join(arguments[i])) for i in sorted(arguments)]
    return ParsedOutput(content="".join(content).strip() or None, tool_calls=calls)


def parse_whole(streamer: ToolStreamer, text: str) -> ParsedOutput:
    """The whole-text result of a fresh streamer fed ``text`` in one delta."""
    return collect([*streamer.feed(text), *streamer.finish()])


def emit_calls(calls: list[ParsedToolCall], first_index: int) -> list[StreamEvent]:
    """One delta per call, carrying its name and whole arguments, indices from ``first_index``."""
    return [ToolCallDelta(index=first_index + k, name=c.name, arguments=c.arguments) for k, c in enumerate(calls)]
