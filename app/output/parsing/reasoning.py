"""``<think>``...``</think>`` reasoning: splits a model's output into ``reasoning_content`` and
``content``.

Two starting points, chosen by the chat template rather than the model: ``think`` (the output opens
outside reasoning; text before ``<think>`` is content) and ``deepseek_r1`` (the template already put
``<think>`` in the prompt, so the output is reasoning until ``</think>``; an output that opens with
``<think>`` anyway is read the same). Only the first reasoning block counts: markers after it are
content. An unclosed block makes everything after its start reasoning.

As with tool calls, ``split`` is the streamer fed the whole text, so streaming cannot drift from it;
a streamer holds back only what could be the start of the marker it is waiting for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum, auto
from functools import partial
from types import MappingProxyType
from typing import Literal

from app.output.parsing.base import HeldText
from app.output.parsing.scan import partial_marker_len, skip_lead

Channel = Literal["reasoning", "content"]
ReasoningEvent = tuple[Channel, str]


@dataclass(frozen=True, slots=True)
class ReasoningSplit:
    reasoning: str | None
    """The reasoning text, stripped; None when empty or absent."""
    content: str | None
    """Everything else, stripped; None when empty."""


class _State(Enum):
    LEAD = auto()
    BEFORE = auto()
    REASONING = auto()
    CONTENT = auto()


class ReasoningStreamer(HeldText[ReasoningEvent]):
    """One output's state: the text held back and where in the output the stream is."""

    __slots__ = ("_start", "_end", "_state")

    def __init__(self, start: str, end: str, starts_in_reasoning: bool) -> None:
        super().__init__()
        self._start = start
        self._end = end
        self._state = _State.LEAD if starts_in_reasoning else _State.BEFORE

    def _drain(self, final: bool) -> list[ReasoningEvent]:
        events: list[ReasoningEvent] = []
        while self._held:
            held = self._held
            if self._state is _State.LEAD:
                at = skip_lead(held, self._start)
                if at is None and not final:
                    return events
                if at is not None and held.lstrip().startswith(self._start):
                    self._held = held[at:]
                self._state = _State.REASONING
            elif self._state is _State.BEFORE:
                if not self._until(events, self._start, "content", _State.REASONING, final):
                    return events
            elif self._state is _State.REASONING:
                if not self._until(events, self._end, "reasoning", _State.CONTENT, final):
                    return events
            else:
                events.append(("content", held))
                self._held = ""
        return events

    def _until(self, events: list[ReasoningEvent], marker: str, channel: Channel, after: _State,
               final: bool) -> bool:
        """Tells ``channel`` the held text up to ``marker`` and moves to ``after`` past it; without
        the marker, tells all but a possible partial marker. Whether the marker was found."""
        held = self._held
        at = held.find(marker)
        if at >= 0:
            told, self._held, self._state = held[:at], held[at + len(marker):], after
        else:
            keep = 0 if final else partial_marker_len(held, marker)
            told, self._held = held[:len(held) - keep], held[len(held) - keep:]
        if told:
            events.append((channel, told))
        return at >= 0


def collect(events: Iterable[ReasoningEvent]) -> ReasoningSplit:
    """Folds a stream's events into the whole-text result."""
    parts: dict[Channel, list[str]] = {"reasoning": [], "content": []}
    for channel, text in events:
        parts[channel].append(text)
    return ReasoningSplit(reasoning="".join(parts["reasoning"]).strip() or None,
                          content="".join(parts["content"]).strip() or None)


@dataclass(frozen=True, slots=True)
class ReasoningParser:
    """The markers and the starting point; pure, shared by every request."""

    start: str = "<think>"
    end: str = "</think>"
    starts_in_reasoning: bool = False

    def __post_init__(self) -> None:
        if not self.start or not self.end:
            raise ValueError("reasoning markers must be non-empty")

    def split(self, text: str) -> ReasoningSplit:
        streamer = self.streamer()
        return collect([*streamer.feed(text), *streamer.finish()])

    def streamer(self) -> ReasoningStreamer:
        return ReasoningStreamer(self.start, self.end, self.starts_in_reasoning)


REASONING_PARSERS: Mapping[str, Callable[[], ReasoningParser]] = MappingProxyType({
    "think": ReasoningParser,
    "deepseek_r1": partial(ReasoningParser, starts_in_reasoning=True),
})


def get_reasoning_parser(name: str) -> ReasoningParser:
    """The parser called ``name``; ValueError naming the known ones otherwise."""
    try:
        return REASONING_PARSERS[name]()
    except KeyError:
        raise ValueError(f"unknown reasoning parser {name!r}; known: {', '.join(sorted(REASONING_PARSERS))}") from None
