"""Tool-call parsing's front door: the shared types (defined in base.py, beneath the formats that
use them, and re-exported here) and the registry of formats by name.

    parser = get_tool_parser("hermes")
    parser.parse(text)              # whole output -> ParsedOutput
    streamer = parser.streamer()    # per request: feed(delta) ... finish() -> StreamEvents

A format is a class with a ``name``, a ``parse`` and a ``streamer``; adding one is adding a module
and a line to ``TOOL_PARSERS``. Parsers hold no state (streamers hold one output's), so one parser
may serve every request.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from app.output.parsing.base import (
    ContentDelta,
    ParsedOutput,
    ParsedToolCall,
    StreamEvent,
    ToolCallDelta,
    ToolParser,
    ToolStreamer,
)
from app.output.parsing.hermes import HermesParser
from app.output.parsing.llama3_json import Llama3JsonParser
from app.output.parsing.pythonic import PythonicParser

__all__ = [
    "TOOL_PARSERS",
    "ContentDelta",
    "ParsedOutput",
    "ParsedToolCall",
    "StreamEvent",
    "ToolCallDelta",
    "ToolParser",
    "ToolStreamer",
    "get_tool_parser",
]

TOOL_PARSERS: Mapping[str, type[ToolParser]] = MappingProxyType({
    parser.name: parser for parser in (HermesParser, Llama3JsonParser, PythonicParser)
})


def get_tool_parser(name: str) -> ToolParser:
    """A parser for the format called ``name``; ValueError naming the known formats otherwise."""
    try:
        return TOOL_PARSERS[name]()
    except KeyError:
        raise ValueError(f"unknown tool-call parser {name!r}; known: {', '.join(sorted(TOOL_PARSERS))}") from None
